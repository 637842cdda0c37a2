"""`agentrl quickstart` settings and report: the recipe files load as the configs of their phases, --set takes
their real dotted keys and fails before any work on a key or value that cannot be used, the code suite and
--smoke are overlays, one seed reaches every phase, and the report says what produced it."""

import json
from pathlib import Path

import pytest
import yaml

from agentrl.cli import build_parser, main
from agentrl.config import load_config, to_dict
from agentrl.quickstart.cli import SMOKE_RUN_DIR, settings_from_args
from agentrl.quickstart.recipe import RECIPE_DIR, SEED_KEYS, QuickstartConfig, QuickstartError, merge, read_folder
from agentrl.quickstart.report import report_text, source_commit
from agentrl.quickstart.run import filled, make_data
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.sft import SFTConfig


def settings(*argv: str) -> QuickstartConfig:
    return settings_from_args(build_parser().parse_args(["quickstart", *argv]))


def value(cfg: QuickstartConfig, key: str):
    node = to_dict(cfg)
    for part in key.split("."):
        node = node[part]
    return node


def test_each_recipe_file_loads_as_its_phases_config():
    assert isinstance(load_config(QuickstartConfig, RECIPE_DIR / "quickstart.yaml"), QuickstartConfig)
    sft = load_config(SFTConfig, RECIPE_DIR / "sft.yaml")
    assert sft.sft.max_steps == 225 and sft.actor.lr == pytest.approx(2e-3)
    train = load_config(TrainConfig, RECIPE_DIR / "train.yaml")
    assert train.rollout.temperature == pytest.approx(0.7) and train.trainer.total_steps == 200
    variants = sorted(p.name for p in RECIPE_DIR.iterdir() if p.is_dir())
    assert variants == ["async", "code", "guess", "smoke", "with-code"]
    for folder in variants:  # overlays hold only the three files, each over its own recipe file
        assert {p.name for p in (RECIPE_DIR / folder).iterdir()} <= {"quickstart.yaml", "sft.yaml", "train.yaml"}
        tree = merge(read_folder(RECIPE_DIR), read_folder(RECIPE_DIR / folder))
        load_config(QuickstartConfig, data=tree)


def test_agentrl_train_runs_train_yaml_once_the_run_time_values_are_given(capsys):
    assert main(["train", str(RECIPE_DIR / "train.yaml"), "model.path=m", "data.train_files=[rl.jsonl]",
                 "tools.services=[{url: 'http://127.0.0.1:1'}]", "trainer.run_dir=runs/q", "--print-config"]) == 0
    assert "clip_ratio_high: 0.28" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["--suites", "code"], ["--smoke"], ["--suites", "code", "--smoke"],
                                  ["--suites", "guess"], ["--suites", "guess", "--smoke"]])
def test_values_that_follow_from_others_are_written_out_consistently(argv):
    """The files write out what the quickstart used to compute: they must still agree with each other."""
    train = settings(*argv).train
    assert train.engine.max_batch_size == train.rollout.max_concurrent_episodes  # a decode slot per episode
    assert train.agent.max_new_tokens_per_turn <= train.agent.max_response_tokens
    assert (train.data.gen_batch_size is not None) == train.algorithm.filter_zero_variance_groups
    assert (train.algorithm.max_filter_rounds > 0) == train.algorithm.filter_zero_variance_groups
    assert train.data.train_batch_size // train.actor.ppo_mini_batch_size == 2  # two optimizer steps per step


def test_set_takes_each_phases_real_keys_with_their_types():
    s = settings("--set", "train.actor.lr=2e-4", "sft.sft.max_steps=150", "model.init=random", "data.suites=[calc]",
                 "data.hard_rl_tasks=false", "train.algorithm.adv_estimator=rloo")
    assert s.train.actor.lr == pytest.approx(2e-4) and s.sft.sft.max_steps == 150 and s.model.init == "random"
    assert s.data.suites == ["calc"] and s.data.hard_rl_tasks is False and s.train.algorithm.adv_estimator == "rloo"
    assert s.train.algorithm.filter_zero_variance_groups  # the recipe's other settings stay


@pytest.mark.parametrize("item,nearest", [("train.actor.lrr=1e-4", "train.actor.lr"),
                                          ("sft.sft.max_step=3", "sft.sft.max_steps"),
                                          ("data.demo={calc: 3}", "data.demos"), ("sed=1", "seed"),
                                          ("train.algorithm.adv_estimatr=rloo", "train.algorithm.adv_estimator")])
def test_an_unknown_key_fails_before_any_work_naming_the_nearest(item, nearest, tmp_path, capsys):
    assert main(["quickstart", "--run-dir", str(tmp_path / "q"), "--set", item]) == 2
    err = capsys.readouterr().err
    assert "error: quickstart: unknown config key" in err and f"in {RECIPE_DIR} + overrides" in err
    assert f"did you mean '{nearest}'?" in err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("key,option", [("run_dir", "--run-dir"), ("tools_port", "--tools-port"),
                                        ("smoke", "--smoke"), ("train.trainer.run_dir", "--run-dir"),
                                        ("sft.model.path", "the model it builds"),
                                        ("train.tools.services", "--tools-port"), ("suites", "--suites")])
def test_keys_the_quickstart_fills_in_are_refused_in_set(key, option, capsys):
    assert main(["quickstart", "--set", f"{key}=1"]) == 2
    assert f"error: quickstart --set {key}: set by the quickstart from {option}" in capsys.readouterr().err


def test_a_smoke_run_is_the_smoke_overlay_in_its_own_run_directory():
    smoke, full = settings("--smoke"), settings()
    assert build_parser().parse_args(["quickstart", "--smoke"]).run_dir is None
    assert SMOKE_RUN_DIR == "runs/quickstart-smoke"
    assert (smoke.sft.sft.max_steps, smoke.train.trainer.total_steps, smoke.train.rollout.n) == (4, 2, 2)
    assert smoke.data.demos == {"calc": 16, "lookup": 16, "code": 16, "guess": 16} and smoke.eval.sampled_n == 2
    assert not smoke.train.algorithm.filter_zero_variance_groups  # both steps update, whatever the rewards
    assert (full.sft.sft.max_steps, full.train.trainer.total_steps) == (225, 200)


def test_async_is_an_overlay_that_names_its_correction_and_composes_with_the_others():
    sync, asynchronous = settings(), settings("--async")
    assert sync.train.trainer.mode == "sync"
    assert asynchronous.train.trainer.mode == "async" and asynchronous.train.trainer.max_staleness == 2
    assert asynchronous.train.algorithm.rollout_correction.level == "token"
    # Nothing else changes: the same model, data, SFT phase and GRPO budget.
    assert to_dict(asynchronous.sft) == to_dict(sync.sft)
    assert {k: v for k, v in to_dict(asynchronous.train).items() if k not in ("trainer", "algorithm")} == \
        {k: v for k, v in to_dict(sync.train).items() if k not in ("trainer", "algorithm")}
    smoke = settings("--async", "--smoke", "--set", "train.trainer.max_staleness=1")
    assert smoke.train.trainer.mode == "async" and smoke.train.trainer.max_staleness == 1
    assert smoke.train.data.train_batch_size == settings("--smoke").train.data.train_batch_size


def test_async_training_without_a_correction_fails_before_any_work(capsys):
    with pytest.raises(QuickstartError, match="rollout_correction"):
        settings("--set", "train.trainer.mode=async")


def test_one_seed_reaches_every_phase_unless_a_phase_key_is_set():
    assert all(value(settings(), key) == 0 for key in SEED_KEYS)
    assert all(value(settings("--set", "seed=3"), key) == 3 for key in SEED_KEYS)
    s = settings("--set", "seed=3", "sft.sft.seed=1", "train.rollout.seed=7")
    assert (s.seed, s.sft.sft.seed, s.train.rollout.seed, s.train.data.seed, s.train.trainer.seed) == (3, 1, 7, 3, 3)


def test_the_code_suite_alone_is_the_code_overlay_under_smoke_and_set():
    code = settings("--suites", "code")
    assert code.data.suites == ["code"] and code.model.size == "tiny3" and code.sft.sft.max_steps == 600
    assert (code.data.demos["code"], code.data.code_test_call, code.data.code_comments) == (2000, False, True)
    assert (code.train.trainer.total_steps, code.train.rollout.max_concurrent_episodes) == (60, 64)
    assert code.train.trainer.max_infra_failed_fraction == 0.25  # stop sooner when the sandbox fails
    assert settings("--set", "data.suites=[code]") == code  # the same run, however the suites are given
    smoke = settings("--suites", "code", "--smoke", "--set", "train.trainer.total_steps=3")
    assert smoke.sft.sft.max_steps == 4 and smoke.train.trainer.total_steps == 3 and smoke.model.size == "tiny"
    default = settings()
    for s in (settings("--suites", "calc,lookup"), settings("--suites", "calc,code")):
        assert (s.sft, s.model, s.train.rollout) == (default.sft, default.model, default.train.rollout)
    assert settings("--suites", "calc,code").train.trainer.max_infra_failed_fraction == 0.25
    assert default.train.trainer.max_infra_failed_fraction == 0.5  # calc/lookup: the trainer's rule


@pytest.mark.parametrize("argv,match", [
    (["--suites", "cod"], "is not one of .calc., .lookup., .code., .guess.; did you mean .code."),
    (["--suites", "code,code"], "choose distinct names"),
    (["--suites", "calc,"], "give comma-separated names"),
    (["--suites", "code", "--set", "data.suites=[calc]"], "give the suites once"),
    (["--set", "data.demos.lookp=3"], "data.demos.lookp: 'lookp' is not one of .*did you mean 'lookup'"),
    (["--set", "data.rl_tasks.lookup=0"], "data.rl_tasks.lookup=0: give a count of at least 1"),
    (["--set", "data.demos={calc: 3}"], "data.demos has no count for lookup: set e.g. data.demos.lookup=1000"),
    (["--set", "data.demos.lookup=many"], "data.demos.lookup: expected int"),
    (["--set", "data.calc_op_weights=[0.5, 0.5]"], "calc operation weights .*e.g. "),
    (["--set", "data.calc_op_weights=[0, 0, 0]"], "calc operation weights .*e.g. "),
    (["--set", "data.calc_op_weights=[true, 1, 1]"], "data.calc_op_weights"),
    (["--set", "train.data.train_batch_size=6"], "multiple of actor.ppo_mini_batch_size"),
    (["--set", "train.rollout.temperature=0"], "temperature=0: must be > 0"),
    (["--set", "train.agent.max_response_tokens=100"], "max_new_tokens_per_turn \\(128\\) is more than the whole"),
])
def test_a_setting_that_cannot_be_used_fails_before_any_work(argv, match):
    with pytest.raises(QuickstartError, match=match):
        settings(*argv)


def test_a_missing_recipe_folder_says_what_to_pass(tmp_path):
    with pytest.raises(QuickstartError, match="does not exist; pass --recipe DIR"):
        settings("--recipe", str(tmp_path))


def test_a_copied_recipe_runs_as_the_shipped_one(tmp_path):
    for path in RECIPE_DIR.rglob("*.yaml"):
        (tmp_path / path.relative_to(RECIPE_DIR)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.relative_to(RECIPE_DIR)).write_text(path.read_text())
    (tmp_path / "train.yaml").write_text((RECIPE_DIR / "train.yaml").read_text().replace("lr: 1.0e-4", "lr: 3.0e-4"))
    copy = settings("--recipe", str(tmp_path), "--suites", "code")
    assert copy.train.actor.lr == pytest.approx(3e-4) and copy.model.size == "tiny3"


def test_run_time_values_fill_in_the_phases_configs(tmp_path):
    code = settings("--suites", "code")
    train = filled(code.train, {"model.path": "m", "reward.sandbox_url": "http://127.0.0.1:2",
                                "tools.services": [{"url": "http://127.0.0.1:1", "name": "quickstart-tools"}]})
    assert train.reward.sandbox_url == "http://127.0.0.1:2" and train.tools.services[0].url == "http://127.0.0.1:1"
    assert train.model.path == "m" and to_dict(train.agent) == to_dict(code.train.agent)


def test_report_says_what_produced_it_and_what_smoke_numbers_mean():
    results = {"after SFT": {"pass@1": 0.0, "num_tasks": 16}, "after GRPO": {"pass@1": 0.0, "num_tasks": 16}}
    timings = {"build the model": 3.2, "GRPO": 75.0}
    smoke = report_text(settings("--smoke"), results, timings, 80.0, commit="abc123 with uncommitted changes",
                        smoke=True)
    assert "**This is a smoke run**" in smoke and "pass@1 at or near 0% before and after GRPO is expected" in smoke
    assert "4 SFT steps and 2 GRPO steps of 2 prompts x 2 episodes, evaluated on 8 held-out tasks" in smoke
    assert "- seed: 0 (initial weights, data); SFT seed 0 (data order); GRPO seed 0 (task order, sampling)" in smoke
    reused = report_text(settings("--set", "sft.sft.seed=1", "train.data.seed=2", "train.rollout.seed=2",
                                  "train.trainer.seed=2", "sft_model=runs/q/sft/model"),
                         results, timings, 80.0, commit="abc123", kernels="ATen AVX2, MKL_CBWR=AVX2")
    assert ("SFT seed 1 (data order), SFT model reused from runs/q/sft/model; GRPO seed 2" in reused
            and "- CPU kernels: ATen AVX2, MKL_CBWR=AVX2" in reused)
    split = report_text(settings("--set", "train.rollout.seed=5"), results, timings, 1.0, commit="abc")
    assert "GRPO seeds 0 (task order), 5 (sampling), 0 (trainer)" in split
    assert "- agentrl commit: abc123 with uncommitted changes" in smoke
    assert "- build the model: 3s" in smoke and "- GRPO: 1m15s" in smoke and "- total: 1m20s" in smoke
    assert "smoke run" not in report_text(settings(), results, timings, 80.0, commit="abc123")
    block = smoke.split("```yaml\n")[1].split("```")[0]  # the resolved recipe, loadable as such
    assert load_config(QuickstartConfig, data=yaml.safe_load(block)) == settings("--smoke")


def test_report_puts_sampled_success_and_pass_at_n_beside_greedy_pass_at_1_per_suite():
    def summary(p1: float, calc: float, lookup: float, key: str = "pass@1") -> dict:
        return {key: p1, "pass@4": min(1.0, p1 + 0.1), "num_tasks": 400,
                "by_data_source": {"calc/heldout": {key: calc, "pass@4": calc + 0.1},
                                   "lookup/heldout": {key: lookup, "pass@4": lookup + 0.05}}}

    greedy = {"after SFT": summary(0.70, 0.74, 0.66), "after GRPO": summary(0.758, 0.80, 0.715)}
    sampled = {"after SFT": summary(0.56, 0.64, 0.489, "mean@n"), "after GRPO": summary(0.69, 0.756, 0.629, "mean@n")}
    cfg = settings("--set", "train.rollout.temperature=1.0")
    report = report_text(cfg, greedy, {}, 1.0, commit="abc", sampled=sampled)
    assert "## Greedy and sampled (T=1, 4 samples per task)" in report
    assert "| suite | greedy pass@1 | sampled success (mean@4) | pass@4 |" in report
    assert ("| calc/heldout | 74.0% -> 80.0% (+6.0) | 64.0% -> 75.6% (+11.6) | 74.0% -> 85.6% (+11.6) |"
            in report)
    assert "| lookup/heldout | 66.0% -> 71.5% (+5.5) | 48.9% -> 62.9% (+14.0) |" in report
    assert report.index("## Greedy and sampled") < report.index("![curves]")
    assert "## Greedy and sampled" not in report_text(cfg, greedy, {}, 1.0, commit="abc")


def test_the_commit_is_known_in_a_checkout_and_said_to_be_unknown_outside(tmp_path):
    commit = source_commit()
    assert len(commit.split()[0]) == 40 or commit.startswith("unknown (")
    assert source_commit(tmp_path) == "unknown (agentrl is not running from a git checkout)"


def test_moving_average_is_a_trailing_mean():
    from agentrl.trainer.curve_panels import moving_average

    assert moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert moving_average([], 3) == [] and moving_average([2.0], 10) == [2.0]


def test_curves_are_drawn_with_held_out_marks_and_both_kls(tmp_path):
    from agentrl.quickstart.report import plot_curves

    (tmp_path / "sft").mkdir()
    (tmp_path / "grpo").mkdir()
    (tmp_path / "sft" / "sft_metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "sft_loss": 2.0 / i}) + "\n" for i in range(1, 30)))
    (tmp_path / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": i, "reward/mean": i / 20, "reward/success_rate": i / 25, "actor/ppo_kl": 1e-3, "actor/kl": 0.01 * i,
         "actor/entropy": 0.5, "episode/model_tokens_mean": 40}) + "\n" for i in range(0, 20)))
    out = tmp_path / "curves.png"
    plot_curves(tmp_path / "sft", tmp_path / "grpo", out, heldout={
        "pass@1 after SFT (greedy)": 0.4, "pass@1 after GRPO (greedy)": 0.55,
        "success after SFT (sampled, T=1)": 0.3, "success after GRPO (sampled, T=1)": 0.5})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sft_model_to_reuse_must_be_a_model_directory(tmp_path):
    from agentrl.quickstart.run import run_quickstart

    with pytest.raises(QuickstartError, match="not a model directory"):
        run_quickstart(settings("--set", f"sft_model={tmp_path}"), tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_code_without_a_sandbox_fails_before_any_work(tmp_path, capsys):
    assert main(["quickstart", "--suites", "code", "--no-sandbox", "--run-dir", str(tmp_path / "q")]) == 2
    assert "no local fallback: drop --no-sandbox" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_rl_tasks_and_demos_set_each_suites_share(tmp_path):
    s = settings("--set", "data.rl_tasks={calc: 12, lookup: 5}", "data.demos={calc: 5, lookup: 3}",
                 "data.heldout_per_suite=2")
    data = make_data(s.data, s.seed, tmp_path)
    counts = {Path(p).name: len(Path(p).read_text().splitlines()) for p in data["rl"]}
    assert counts == {"calc-rl.jsonl": 12, "lookup-rl.jsonl": 5}
    rows = [json.loads(line) for line in Path(data["sft"]).read_text().splitlines()]
    sources = [row["data_source"].split("/")[0] for row in rows]
    assert (sources.count("calc"), sources.count("lookup")) == (5, 3)


def test_calc_op_weights_set_the_calc_demonstrations_chain_lengths_only(tmp_path):
    from agentrl.data.suites import make_suite

    def num_ops(*extra: str) -> tuple[list[int], list[str]]:
        s = settings("--set", "data.demos={calc: 200, lookup: 2}", "data.rl_tasks={calc: 50, lookup: 50}",
                     "data.heldout_per_suite=2", *extra)
        data = make_data(s.data, s.seed, tmp_path / str(len(list(tmp_path.iterdir()))))
        demos = [json.loads(line) for line in Path(data["sft"]).read_text().splitlines()]
        calls = [row["messages"][2]["tool_calls"][0]["function"]["arguments"]["expression"] for row in demos
                 if row["data_source"] == "calc/train"]
        calc_rl = [Path(p).read_text() for p in data["rl"] if Path(p).name == "calc-rl.jsonl"]
        return [call.count(" ") // 2 for call in calls], calc_rl

    recipe, recipe_rl = num_ops()
    split, split_rl = num_ops("data.calc_op_weights=null")  # the train split's own shares
    assert recipe.count(3) > 1.4 * split.count(3) > 0 and len(recipe) == len(split) == 200
    assert recipe_rl == split_rl and recipe_rl  # calc's RL tasks (the hard mix) do not change
    only_one, _ = num_ops("data.calc_op_weights=[1, 0, 0]")
    assert set(only_one) == {1}
    # the recipe draws what make_suite draws with those weights (same tasks, same order)
    tasks, _ = make_suite("calc", "train", 200, 0, calc_op_weights=tuple(settings().data.calc_op_weights))
    assert [t["extra"]["num_ops"] for t in tasks] == recipe


def test_code_demos_are_made_only_with_a_sandbox(tmp_path):
    s = settings("--suites", "code", "--smoke")
    with pytest.raises(QuickstartError, match="verified in the sandbox"):
        make_data(s.data, s.seed, tmp_path)
