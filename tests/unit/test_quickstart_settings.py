"""`agentrl quickstart` settings and report: --set values take the setting's declared type, --smoke has its own
run directory, and the report says what produced it (seed, commit, phase times) and what a smoke run's numbers
mean."""

import dataclasses
import json
from pathlib import Path

import pytest

from agentrl.cli import build_parser, main
from agentrl.quickstart import (
    SMOKE_RUN_DIR,
    QuickstartError,
    QuickstartSettings,
    _setting_value,
    report_text,
    settings_from_args,
    source_commit,
    train_config,
)

FIELDS = {f.name: f for f in dataclasses.fields(QuickstartSettings)}


def settings(*argv: str) -> QuickstartSettings:
    return settings_from_args(build_parser().parse_args(["quickstart", *argv]))


def test_numbers_follow_the_declared_type():
    # YAML 1.1 reads "2e-4" as a string; the quickstart must pass a float to the trainer's config.
    assert _setting_value("grpo_lr", "2e-4", FIELDS["grpo_lr"]) == pytest.approx(2e-4)
    assert _setting_value("sft_steps", "150", FIELDS["sft_steps"]) == 150
    assert _setting_value("init", "random", FIELDS["init"]) == "random"
    assert _setting_value("suites", "[calc]", FIELDS["suites"]) == ["calc"]


def test_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(QuickstartError, match="sft_steps='many' is not a valid int"):
        _setting_value("sft_steps", "many", FIELDS["sft_steps"])


def test_booleans_read_as_yaml():
    assert _setting_value("grpo_hard_tasks", "false", FIELDS["grpo_hard_tasks"]) is False


@pytest.mark.parametrize("key,option", [("run_dir", "--run-dir"), ("tools_port", "--tools-port"),
                                        ("smoke", "--smoke")])
def test_settings_with_their_own_option_are_refused_in_set(key, option, capsys):
    assert main(["quickstart", "--set", f"{key}=1"]) == 2
    assert f"error: quickstart --set: {key} has its own option; use {option}" in capsys.readouterr().err


def test_a_smoke_run_has_its_own_run_directory():
    smoke, full = settings("--smoke"), settings()
    assert (smoke.run_dir, smoke.smoke) == (SMOKE_RUN_DIR, True) and smoke.sft_steps < full.sft_steps
    assert (full.run_dir, full.smoke) == (QuickstartSettings.run_dir, False)
    assert settings("--smoke", "--run-dir", "elsewhere").run_dir == "elsewhere"


def test_report_says_what_produced_it_and_what_smoke_numbers_mean():
    results = {"after SFT": {"pass@1": 0.0, "num_tasks": 16}, "after GRPO": {"pass@1": 0.0, "num_tasks": 16}}
    timings = {"build the model": 3.2, "GRPO": 75.0}
    smoke = report_text(settings("--smoke"), results, timings, 80.0, commit="abc123 with uncommitted changes")
    assert "**This is a smoke run**" in smoke and "pass@1 at or near 0% before and after GRPO is expected" in smoke
    assert "- seed: 0 (initial weights, data); SFT seed 0 (data order); GRPO seed 0 (task order, sampling)" in smoke
    reused = report_text(settings("--set", "sft_seed=1", "grpo_seed=2", "sft_model=runs/q/sft/model"), results,
                         timings, 80.0, commit="abc123", kernels="ATen AVX2, MKL_CBWR=AVX2")
    assert ("SFT seed 1 (data order), SFT model reused from runs/q/sft/model; GRPO seed 2" in reused
            and "- CPU kernels: ATen AVX2, MKL_CBWR=AVX2" in reused)
    assert "- agentrl commit: abc123 with uncommitted changes" in smoke
    assert "- build the model: 3s" in smoke and "- GRPO: 1m15s" in smoke and "- total: 1m20s" in smoke
    assert "smoke run" not in report_text(settings(), results, timings, 80.0, commit="abc123")


def test_report_puts_sampled_success_and_pass_at_n_beside_greedy_pass_at_1_per_suite():
    def summary(p1: float, calc: float, lookup: float, key: str = "pass@1") -> dict:
        return {key: p1, "pass@4": min(1.0, p1 + 0.1), "num_tasks": 400,
                "by_data_source": {"calc/heldout": {key: calc, "pass@4": calc + 0.1},
                                   "lookup/heldout": {key: lookup, "pass@4": lookup + 0.05}}}

    greedy = {"after SFT": summary(0.70, 0.74, 0.66), "after GRPO": summary(0.758, 0.80, 0.715)}
    sampled = {"after SFT": summary(0.56, 0.64, 0.489, "mean@n"), "after GRPO": summary(0.69, 0.756, 0.629, "mean@n")}
    report = report_text(settings(), greedy, {}, 1.0, commit="abc", sampled=sampled, sampled_temperature=1.0)
    assert "## Greedy and sampled (T=1, 4 samples per task)" in report
    assert "| suite | greedy pass@1 | sampled success (mean@4) | pass@4 |" in report
    assert ("| calc/heldout | 74.0% -> 80.0% (+6.0) | 64.0% -> 75.6% (+11.6) | 74.0% -> 85.6% (+11.6) |"
            in report)
    assert "| lookup/heldout | 66.0% -> 71.5% (+5.5) | 48.9% -> 62.9% (+14.0) |" in report
    assert report.index("## Greedy and sampled") < report.index("![curves]")
    assert "## Greedy and sampled" not in report_text(settings(), greedy, {}, 1.0, commit="abc")


def test_the_commit_is_known_in_a_checkout_and_said_to_be_unknown_outside(tmp_path):
    commit = source_commit()
    assert len(commit.split()[0]) == 40 or commit.startswith("unknown (")
    assert source_commit(tmp_path) == "unknown (agentrl is not running from a git checkout)"


def test_moving_average_is_a_trailing_mean():
    from agentrl.trainer.curve_panels import moving_average

    assert moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert moving_average([], 3) == [] and moving_average([2.0], 10) == [2.0]


def test_curves_are_drawn_with_held_out_marks_and_both_kls(tmp_path):
    import json

    from agentrl.quickstart import plot_curves

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
    from agentrl.quickstart import QuickstartError, run_quickstart

    s = settings("--set", f"sft_model={tmp_path}")
    with pytest.raises(QuickstartError, match="not a model directory"):
        run_quickstart(s)


def test_dynamic_sampling_follows_grpo_filter_rounds(tmp_path):
    from agentrl.quickstart import train_config

    def algorithm(**overrides):
        s = dataclasses.replace(QuickstartSettings(), **overrides)
        return train_config(s, "model", ["rl.jsonl"], "http://127.0.0.1:1", tmp_path).algorithm

    on = algorithm()
    assert on.filter_zero_variance_groups and on.max_filter_rounds == QuickstartSettings().grpo_filter_rounds > 0
    off = algorithm(grpo_filter_rounds=0)
    assert not off.filter_zero_variance_groups and off.max_filter_rounds == 0


def test_dynamic_sampling_oversamples_its_rounds_and_the_engine_decodes_every_concurrent_episode(tmp_path):
    from agentrl.quickstart import train_config

    def config(**overrides):
        return train_config(dataclasses.replace(QuickstartSettings(), **overrides), "model", ["rl.jsonl"],
                            "http://127.0.0.1:1", tmp_path)

    cfg = config()
    s = QuickstartSettings()
    assert cfg.data.gen_batch_size == s.grpo_gen_prompts_per_step > cfg.data.train_batch_size
    assert cfg.engine.max_batch_size == cfg.rollout.max_concurrent_episodes >= s.grpo_gen_prompts_per_step * s.grpo_n
    assert config(grpo_filter_rounds=0).data.gen_batch_size is None  # nothing to oversample for
    assert config(grpo_gen_prompts_per_step=2).data.gen_batch_size == s.grpo_prompts_per_step


def test_grpo_sampling_is_seeded_by_grpo_seed(tmp_path):
    from agentrl.quickstart import train_config

    s = dataclasses.replace(QuickstartSettings(), seed=3, grpo_seed=7)
    cfg = train_config(s, "model", ["rl.jsonl"], "http://127.0.0.1:1", tmp_path)
    assert cfg.rollout.seed == 7 and cfg.trainer.seed == 7 and cfg.data.seed == 7


def test_rl_overrides_reach_the_trainer_config_and_bad_keys_fail_first(tmp_path):
    from agentrl.quickstart import train_config

    s = settings("--set", "rl_overrides=[algorithm.adv_estimator=rloo, actor.lr=2e-4]")
    cfg = train_config(s, "model", ["rl.jsonl"], "http://127.0.0.1:1", tmp_path)
    assert cfg.algorithm.adv_estimator == "rloo" and cfg.actor.lr == pytest.approx(2e-4)
    assert cfg.algorithm.filter_zero_variance_groups  # the quickstart's own settings stay
    with pytest.raises(QuickstartError, match="rl_overrides: .*algorithm.adv_estimatr"):
        settings("--set", "rl_overrides=[algorithm.adv_estimatr=rloo]")


def test_grpo_tasks_sets_each_suites_share_of_the_rl_prompts(tmp_path):
    from agentrl.quickstart import make_data

    s = settings("--set", "grpo_tasks={calc: 12}", "grpo_tasks_per_suite=5", "sft_demos={}", "sft_demos_per_suite=2",
                 "heldout_per_suite=2")
    data = make_data(s, tmp_path)
    counts = {Path(p).name: len(Path(p).read_text().splitlines()) for p in data["rl"]}
    assert counts == {"calc-rl.jsonl": 12, "lookup-rl.jsonl": 5}


def test_sft_demos_sets_each_suites_share_of_the_demonstrations(tmp_path):
    from agentrl.quickstart import make_data

    s = settings("--set", "sft_demos={lookup: 3}", "sft_demos_per_suite=5", "grpo_tasks_per_suite=2",
                 "heldout_per_suite=2")
    rows = [json.loads(line) for line in Path(make_data(s, tmp_path)["sft"]).read_text().splitlines()]
    sources = [row["data_source"].split("/")[0] for row in rows]
    assert (sources.count("calc"), sources.count("lookup")) == (5, 3)


def test_the_recipes_per_suite_counts_apply_to_the_suites_a_run_has():
    default = settings()
    assert default.sft_demos == {"calc": 2000, "lookup": 1000} and default.grpo_tasks == {"lookup": 2667}
    calc = settings("--suites", "calc")  # no lookup in the run: nothing to rebalance, and no error either
    assert calc.sft_demos == {"calc": 2000} and calc.grpo_tasks == {}
    assert settings("--suites", "code").sft_demos == {}
    smoke = settings("--smoke")  # a few demonstrations and tasks per suite, lookup's too
    assert smoke.sft_demos == {} and smoke.grpo_tasks == {}
    # given, a dict replaces the recipe's whole: {} is the per-suite count for every suite
    assert settings("--set", "sft_demos={}", "grpo_tasks={calc: 10}").sft_demos == {}
    assert settings("--set", "grpo_tasks={calc: 10}").grpo_tasks == {"calc": 10}


def test_sft_calc_op_weights_set_the_calc_demonstrations_chain_lengths_only(tmp_path):
    from agentrl.data.suites import make_suite
    from agentrl.quickstart import make_data

    def num_ops(*extra: str) -> tuple[list[int], list[str]]:
        s = settings("--set", "sft_demos={calc: 200, lookup: 2}", "grpo_tasks_per_suite=50", "heldout_per_suite=2",
                     *extra)
        data = make_data(s, tmp_path / str(len(list(tmp_path.iterdir()))))
        demos = [json.loads(line) for line in Path(data["sft"]).read_text().splitlines()]
        calls = [row["messages"][2]["tool_calls"][0]["function"]["arguments"]["expression"] for row in demos
                 if row["data_source"] == "calc/train"]
        calc_rl = [Path(p).read_text() for p in data["rl"] if Path(p).name == "calc-rl.jsonl"]
        return [call.count(" ") // 2 for call in calls], calc_rl

    recipe, recipe_rl = num_ops()
    split, split_rl = num_ops("sft_calc_op_weights=null")  # the train split's own shares
    assert recipe.count(3) > 1.4 * split.count(3) > 0 and len(recipe) == len(split) == 200
    assert recipe_rl == split_rl and recipe_rl  # calc's RL tasks (the hard mix) do not change
    only_one, _ = num_ops("sft_calc_op_weights=[1, 0, 0]")
    assert set(only_one) == {1}
    # the quickstart's default draws what make_suite draws with those weights (same tasks, same order)
    default = settings()
    tasks, _ = make_suite("calc", "train", 200, 0, calc_op_weights=tuple(default.sft_calc_op_weights))
    assert [t["extra"]["num_ops"] for t in tasks] == recipe


@pytest.mark.parametrize("value", ["[0.5, 0.5]", "[1, -1, 1]", "[0, 0, 0]", "many", "[a, b, c]", "[true, 1, 1]"])
def test_sft_calc_op_weights_are_checked_before_any_work(value):
    with pytest.raises(QuickstartError, match="sft_calc_op_weights: calc operation weights .*e.g. "):
        settings("--set", f"sft_calc_op_weights={value}")


@pytest.mark.parametrize("value", ["{lookp: 3}", "{lookup: 0}", "{lookup: many}", "{lookup: true}", "[lookup]"])
@pytest.mark.parametrize("key", ["sft_demos", "grpo_tasks"])
def test_per_suite_counts_name_this_runs_suites_before_any_work(key, value):
    with pytest.raises(QuickstartError, match=f"quickstart --set {key}=.*suites of this run \\(calc, lookup\\)"):
        settings("--set", f"{key}={value}")


def test_suites_option_picks_the_code_defaults_under_smoke_and_set():
    from agentrl.quickstart import CODE_DEFAULTS

    code = settings("--suites", "code")
    assert code.suites == ["code"] and all(getattr(code, k) == v for k, v in CODE_DEFAULTS.items())
    assert settings("--set", "suites=[code]") == code  # the same run, however the suites are given
    # --smoke and --set still win over the suite's defaults
    smoke = settings("--suites", "code", "--smoke", "--set", "grpo_steps=3")
    assert smoke.sft_steps == settings("--smoke").sft_steps and smoke.grpo_steps == 3
    # the calc and lookup recipe keeps the class defaults, alone or with code
    default = QuickstartSettings()
    for s in (settings(), settings("--suites", "calc,lookup"), settings("--suites", "calc,code")):
        assert (s.sft_demos_per_suite, s.grpo_steps, s.max_response_tokens, s.max_concurrent_episodes) == (
            default.sft_demos_per_suite, default.grpo_steps, default.max_response_tokens,
            default.max_concurrent_episodes)


@pytest.mark.parametrize("argv,match", [
    (["--suites", "cod"], "choose distinct names among calc, lookup, code"),
    (["--suites", "code,code"], "choose distinct names"),
    (["--suites", "code", "--set", "suites=[calc]"], "give the suites once"),
    (["--suites", "code", "--no-sandbox"], "no local fallback: drop --no-sandbox"),
])
def test_bad_suites_and_code_without_a_sandbox_fail_before_any_work(argv, match):
    with pytest.raises(QuickstartError, match=match):
        settings(*argv)


def test_code_runs_grade_and_stop_in_the_sandbox(tmp_path):
    from agentrl.quickstart import train_config

    code = settings("--suites", "code")
    cfg = train_config(code, "model", ["rl.jsonl"], "http://127.0.0.1:1", tmp_path, sandbox_url="http://127.0.0.1:2")
    assert cfg.reward.sandbox_url == "http://127.0.0.1:2" and cfg.trainer.max_infra_failed_fraction < 0.5
    assert cfg.rollout.max_concurrent_episodes == code.max_concurrent_episodes
    assert cfg.agent.max_new_tokens_per_turn == code.max_new_tokens_per_turn
    calc = train_config(settings(), "model", ["rl.jsonl"], "http://127.0.0.1:1", tmp_path)
    # calc/lookup runs stop on failing tool services by the trainer's default rules, as any `agentrl train`
    assert calc.reward.sandbox_url is None and calc.trainer.max_infra_failed_fraction == 0.5
    assert calc.trainer.infra_streak_steps == 3 and calc.trainer.infra_streak_fraction == 0.25
    assert calc.agent.max_new_tokens_per_turn == 128  # the calc/lookup recipe as measured


def test_code_demos_are_made_only_with_a_sandbox(tmp_path):
    from agentrl.quickstart import make_data

    s = settings("--suites", "code", "--set", "sft_demos_per_suite=2", "heldout_per_suite=2",
                 "grpo_tasks_per_suite=2")
    with pytest.raises(QuickstartError, match="verified in the sandbox"):
        make_data(s, tmp_path)


def test_grpo_temperature_reaches_the_rollouts_and_zero_is_refused_before_any_work(tmp_path, capsys):
    s = settings("--set", "grpo_temperature=0.7")
    cfg = train_config(s, "model", ["tasks.jsonl"], "http://127.0.0.1:1", tmp_path / "grpo")
    assert cfg.rollout.temperature == pytest.approx(0.7)
    assert main(["quickstart", "--run-dir", str(tmp_path / "q"), "--set", "grpo_temperature=0"]) == 2
    assert "error: quickstart --set grpo_temperature=0: must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
