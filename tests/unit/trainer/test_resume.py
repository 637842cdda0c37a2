"""How a run starts in its run directory: a resume cuts the records back to the checkpoint's step, a changed
config that the checkpoint depends on stops it before anything is written, a finished run is not rerun, and a
fresh start moves an earlier run aside."""

from __future__ import annotations

import json

import pytest
import yaml

from agentrl.config import load_config, save_config
from agentrl.errors import one_line
from agentrl.trainer.checkpoint import begin_checkpoint, commit_checkpoint, list_checkpoints
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics
from agentrl.trainer.resume import (
    RECORDED_PATHS,
    CompletedRunError,
    ResumeConfigError,
    mark_complete,
    plan_start,
    prepare_run_dir,
)


def cfg(run_dir, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["model.path=runs/m", "data.train_files=[data/t.jsonl]",
                                           "data.train_batch_size=2", "actor.ppo_mini_batch_size=1",
                                           f"trainer.run_dir={run_dir}", "trainer.total_steps=3", *overrides])


def fake_run(run_dir, steps: int, config: TrainConfig) -> None:
    """What a run that stopped after `steps` leaves: rows per step, a checkpoint per step, the final model."""
    run_dir.mkdir(parents=True)
    save_config(config, run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(steps + 1)))
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps({"step": s, "uid": f"u{s}-{k}"}) + "\n"
                                                    for s in range(1, steps + 1) for k in range(2)))
    for step in range(1, steps + 1):
        tmp = begin_checkpoint(run_dir, step)
        save_config(config, tmp)
        commit_checkpoint(tmp, step)
    (run_dir / "final_model").mkdir()
    mark_complete(run_dir, steps)


def test_resume_from_an_earlier_checkpoint_cuts_every_record_back_to_its_step(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 3, cfg(run))
    first_config = (run / "config.yaml").read_text()
    resumed = cfg(run, f"trainer.resume={run / 'checkpoints' / 'step_000002'}", "actor.lr=3e-6")
    start = plan_start(resumed)
    assert (start.step, start.complete) == (2, False)
    notes = prepare_run_dir(resumed, start)
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert [e["step"] for e in episodes] == [1, 1, 2, 2]
    assert [p.name for p in list_checkpoints(run)] == ["step_000001", "step_000002"]
    assert not (run / "final_model").exists() and not (run / "COMPLETE").exists()
    assert (run / "config.yaml").read_text() == first_config  # the first start's config stays
    assert "lr: 3.0e-06" in (run / "config.resume-2.yaml").read_text()
    assert notes == [f"resuming after step 2 from {run / 'checkpoints' / 'step_000002'}; removed metrics.jsonl rows "
                     "after step 2, episodes.jsonl rows after step 2, checkpoints step_000003, final_model/"]


def test_a_finished_run_is_complete_until_total_steps_grows(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 3, cfg(run))
    assert plan_start(cfg(run)).complete and plan_start(cfg(run)).step == 3
    extended = plan_start(cfg(run, "trainer.total_steps=5"))
    assert (extended.complete, extended.step, extended.checkpoint.name) == (False, 3, "step_000003")
    assert plan_start(cfg(run, "trainer.resume=never")).checkpoint is None


def test_a_finished_run_asked_with_other_data_says_so_instead_of_claiming_completion(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 3, cfg(run))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CompletedRunError) as e:
        plan_start(cfg(run, "data.train_files=[data/other.parquet]", "actor.lr=2e-5"))
    message = str(e.value)
    assert message == one_line(message)
    assert message == (f"{run} holds a run completed at step 3 with another config (actor.lr (1e-06 -> 2e-05), "
                       "data.train_files (['data/t.jsonl'] -> ['data/other.parquet'])); to train this config, set "
                       "another trainer.run_dir, remove the directory, or pass trainer.resume=never (moves it aside)")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    many = cfg(run, "actor.lr=2e-5", "rollout.n=2", "data.seed=4", "agent.max_assistant_turns=2")
    with pytest.raises(CompletedRunError, match=r"\(\d+ -> \d+\) and 1 more\); to train"):
        plan_start(many)
    assert plan_start(cfg(run, "trainer.total_steps=2")).complete  # fewer steps: the same run, already done


def test_a_run_saved_with_every_knob_listed_is_still_complete_and_resumes(tmp_path):
    """Run directories written before the loss modes and estimators were keyed on their names list every knob of
    every mode at its default; the same config is the same run, and resuming it is allowed."""
    run = tmp_path / "run"
    fake_run(run, 3, cfg(run))
    for path in [run / "config.yaml", *run.glob("checkpoints/*/config.yaml")]:
        old = yaml.safe_load(path.read_text())
        old["algorithm"].update(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)
        old["actor"]["policy_loss"].update(clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0,
                                           kl_cov_ratio=0.0002, ppo_kl_coef=0.1)
        path.write_text(yaml.safe_dump(old, sort_keys=False))
    assert plan_start(cfg(run)).complete
    extended = plan_start(cfg(run, "trainer.total_steps=5"))
    assert (extended.complete, extended.step) == (False, 3)
    assert load_config(TrainConfig, run / "config.yaml") == cfg(run)  # and it loads (e.g. for agentrl eval)
    with pytest.raises(CompletedRunError, match=r"actor.policy_loss.loss_mode \('vanilla' -> 'gspo'\)"):
        plan_start(cfg(run, "actor.policy_loss.loss_mode=gspo"))


def test_the_recorded_configs_hold_absolute_paths_and_match_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "m").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.jsonl").write_text("")
    config = cfg("run")
    prepare_run_dir(config, plan_start(config))
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["model"]["path"] == str(tmp_path / "runs" / "m")
    assert recorded["data"]["train_files"] == [str(tmp_path / "data" / "t.jsonl")]
    assert recorded["tools"]["config"] is None and "tools.config" in RECORDED_PATHS
    mark_complete(tmp_path / "run", 3)
    assert plan_start(config).complete  # the relative paths of the command are the recorded absolute ones


def test_a_changed_key_the_checkpoint_depends_on_stops_the_resume_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 3, cfg(run))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    changed = cfg(run, "trainer.total_steps=5", "actor.world_size=2", "data.train_batch_size=4", "rollout.n=2",
                  "actor.lr=1e-5")
    with pytest.raises(ResumeConfigError) as e:
        plan_start(changed)
    message = str(e.value)
    assert message == one_line(message)
    assert message.startswith(f"cannot resume from {run / 'checkpoints' / 'step_000003'}: ")
    assert "actor.world_size (1 -> 2), data.train_batch_size (2 -> 4), rollout.n (8 -> 2)" in message
    assert "actor.lr" not in message and "trainer.resume=never" in message
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_paths_are_compared_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    fake_run(run, 1, cfg(run))
    start = plan_start(cfg(run, f"model.path={tmp_path / 'runs' / 'm'}", "trainer.total_steps=2"))
    assert start.step == 1


def test_a_fresh_start_moves_an_earlier_run_aside(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 2, cfg(run))
    fresh = cfg(run, "trainer.resume=never")
    notes = prepare_run_dir(fresh, plan_start(fresh))
    assert notes == [f"{run} holds an earlier run (trainer.resume=never): moved it to {tmp_path / 'run.old-1'}"]
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    assert [r["step"] for r in read_metrics(tmp_path / "run.old-1")] == [0, 1, 2]
    (run / "metrics.jsonl").write_text('{"step": 0}\n')  # the new run logged something, then started over again
    prepare_run_dir(fresh, plan_start(fresh))
    assert (tmp_path / "run.old-2" / "metrics.jsonl").is_file()


def test_a_run_dir_with_only_a_config_is_reused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("old: true\n")
    assert prepare_run_dir(cfg(run), plan_start(cfg(run))) == []
    assert "old: true" not in (run / "config.yaml").read_text()
    assert not (tmp_path / "run.old-1").exists()


def test_a_run_with_a_critic_resumes_only_from_a_checkpoint_with_one(tmp_path):
    run = tmp_path / "run"
    fake_run(run, 1, cfg(run))  # a GRPO run: no critic/ in its checkpoint
    with pytest.raises(ResumeConfigError) as e:
        plan_start(cfg(run, "algorithm.adv_estimator=gae"))
    assert "critic.enable (true here; the checkpoint has no critic/: its run had no critic)" in str(e.value)
    checkpoint = list_checkpoints(run)[0]
    (checkpoint / "critic").mkdir()
    (checkpoint / "critic_rank0.pt").touch()
    assert plan_start(cfg(run, "algorithm.adv_estimator=gae")).step == 1
    with pytest.raises(ResumeConfigError, match=r"critic.world_size \(1 -> 2\)"):
        plan_start(cfg(run, "algorithm.adv_estimator=gae", "critic.world_size=2"))
    assert plan_start(cfg(run)).step == 1  # a run without a critic ignores the checkpoint's
