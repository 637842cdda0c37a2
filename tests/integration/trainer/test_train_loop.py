"""End to end: `agentrl train`'s loop on the tiny model with a real HTTP tool service, the LocalEngine and two
Ray FSDP ranks (sharded checkpoints); then running it again is a no-op, a resume from the step-1 checkpoint
rewrites the run directory exactly as the uninterrupted run wrote it, and a checkpoint exports to the trained
weights."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import free_port, service

from agentrl.config import load_config
from agentrl.trainer.checkpoint import list_checkpoints
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def calculator_service():
    port = free_port()
    with service([sys.executable, "-m", "agentrl.cli", "tools", "serve", "agentrl.tools.builtin.calculator:calculator",
                  "--port", str(port)], f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


def config(model_dir, tasks, tool_url, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", f"data.val_files=[{tasks['heldout']}]",
        "data.train_batch_size=2", "data.val_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=1",
        "agent.max_new_tokens_per_turn=16", "agent.max_response_tokens=64", "agent.max_assistant_turns=2",
        "reward.custom={parity: 'train_rewards:first_token_parity'}", "tools.builtin=[]",
        f"tools.services=[{{url: '{tool_url}'}}]", "actor.lr=1e-3", "actor.warmup_steps=0",
        "trainer.total_steps=2", "trainer.save_freq=1", "trainer.test_freq=2", "trainer.deterministic=true",
        "trainer.loggers=[jsonl]", "actor.world_size=2", f"trainer.run_dir={run_dir}", *extra])


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("timing/", "perf/"))}


EPISODE_FIELDS = ("step", "uid", "sample_index", "prompt_ids", "response_ids", "response_mask", "response_versions",
                  "reward", "finish_reason", "num_turns", "infra_error")


def episode_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


def test_grpo_run_resume_rerun_and_export(ray_session, tiny_model_dir, calc_tasks, calculator_service, tmp_path,
                                          capsys):
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.export import export_checkpoint
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    train(config(tiny_model_dir, calc_tasks, calculator_service, run))
    out = capsys.readouterr().out
    assert out.startswith(f"train: run dir {run} | model {tiny_model_dir} | tasks 16 ")
    assert "| batch 2 prompts x 4 episodes | engine local | world size 2" in out.splitlines()[0]

    rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["data/infra_failed"] == 0
        assert row["actor/grad_norm"] > 0  # mixed rewards: the policy really moved
        assert row["actor/skipped_steps"] == 0
        for key in ("reward/mean", "reward/success_rate", "adv/std", "actor/pg_clipfrac", "actor/ppo_kl",
                    "actor/kl_loss", "actor/entropy", "actor/lr", "episode/model_tokens_mean", "tools/calls",
                    "timing/rollout_s", "timing/update_s", "timing/driver_overhead_frac", "perf/update_tokens_per_s"):
            assert key in row, key
    # Step 2 was sampled by the engine after the step-1 weight sync: rollout and trainer logprobs agree.
    assert rows[1]["drift/abs_max"] < 1e-4
    # Sync mode trains on what the current weights sampled: staleness 0 everywhere, no episode spans an update,
    # and every policy token records the engine's version at its step (0 before any sync, one sync per step).
    for row in rows:
        assert row["rollout/staleness_max"] == row["rollout/staleness_mean"] == 0
        assert row["rollout/staleness_hist/0"] == row["rollout/episodes"] == 8
        assert row["rollout/episodes_spanning_update"] == row["rollout/unversioned_episodes"] == 0
    for ep in episode_rows(run):
        assert len(ep["response_versions"]) == len(ep["response_ids"])
        assert {v for v, m in zip(ep["response_versions"], ep["response_mask"]) if m} == {ep["step"] - 1}
        assert all(v == -1 for v, m in zip(ep["response_versions"], ep["response_mask"]) if not m)
    assert any(k.startswith("val/reward/mean") for r in read_metrics(run) for k in r)
    assert [p.name for p in list_checkpoints(run)] == ["step_000001", "step_000002"]
    assert (run / "config.yaml").is_file() and (run / "episodes.jsonl").is_file()
    # The trained policy is exported as a plain HF model dir that differs from the initial weights.
    final = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(final[k], initial[k]) for k in final)
    uninterrupted_metrics, uninterrupted_episodes = read_metrics(run), episode_rows(run)
    first_config = (run / "config.yaml").read_text()

    # Running the finished run again does nothing and leaves final_model as it is.
    written = (run / "final_model" / "model.safetensors").stat().st_ino
    assert train(config(tiny_model_dir, calc_tasks, calculator_service, run)) == {}
    assert "run already complete at step 2 in " in capsys.readouterr().out
    assert (run / "final_model" / "model.safetensors").stat().st_ino == written

    # A run stopped after step 2 and resumed from the step-1 checkpoint: metrics.jsonl and episodes.jsonl hold
    # every step once, as the uninterrupted run wrote them, and the final weights are the same.
    train(config(tiny_model_dir, calc_tasks, calculator_service, run,
                 f"trainer.resume={run / 'checkpoints' / 'step_000001'}"))
    assert f"resuming after step 1 from {run / 'checkpoints' / 'step_000001'}" in capsys.readouterr().out
    resumed = read_metrics(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted_metrics] == [0, 1, 2]
    for want, got in zip(uninterrupted_metrics, resumed):
        want, got = comparable(want), comparable(got)
        assert want.keys() == got.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
    episodes = episode_rows(run)
    assert [[e[k] for k in EPISODE_FIELDS] for e in episodes] == \
        [[e[k] for k in EPISODE_FIELDS] for e in uninterrupted_episodes]
    for want, got in zip(uninterrupted_episodes, episodes):
        assert got["response_logprobs"] == pytest.approx(want["response_logprobs"], abs=1e-5)
    assert (run / "config.yaml").read_text() == first_config and (run / "config.resume-1.yaml").is_file()
    refinal = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    for key in final:
        torch.testing.assert_close(refinal[key], final[key], atol=1e-6, rtol=0, msg=key)

    # The sharded step-2 checkpoint (2 ranks) exports to the same weights as final_model.
    exported = AutoModelForCausalLM.from_pretrained(export_checkpoint(run / "checkpoints" / "step_000002",
                                                                      tmp_path / "exported")).state_dict()
    assert all(torch.equal(exported[k], refinal[k]) for k in refinal)
