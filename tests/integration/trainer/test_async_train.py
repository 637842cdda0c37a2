"""Async training (`trainer.mode: async`) at max_staleness 0 trains exactly what sync mode trains: the same
episodes token for token and the same losses (to float rounding: the engine decodes a group with other groups
than sync mode's batch does, so logprobs differ in the last bits, and the TIS weights with them); its producer
metrics are logged. At max_staleness 1 every token's version is within the bound or its group was dropped and
counted, and a resumed run trains every step once."""

from __future__ import annotations

import json

import pytest

from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

EPISODE_FIELDS = ("step", "sample_index", "prompt_ids", "response_ids", "response_mask", "response_versions",
                  "reward", "finish_reason", "num_turns", "infra_error")


def config(model_dir, tasks, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", "data.val_files=[]",
        "data.train_batch_size=2",
        "rollout.n=4", "actor.ppo_mini_batch_size=1", "agent.max_new_tokens_per_turn=16",
        "agent.max_response_tokens=64", "agent.max_assistant_turns=2",
        "reward.custom={parity: 'train_rewards:first_token_parity'}", "actor.lr=1e-3", "actor.warmup_steps=0",
        "algorithm.rollout_correction.level=token", "trainer.total_steps=3", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.deterministic=true", "trainer.loggers=[jsonl]", "trainer.save_hf_model=false",
        "actor.world_size=1", f"trainer.run_dir={run_dir}", *extra])


def episode_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


def test_async_at_staleness_0_trains_the_batches_sync_trains(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from agentrl.trainer.loop import train

    sync_run, async_run = tmp_path / "sync", tmp_path / "async"
    train(config(tiny_model_dir, calc_tasks, sync_run))
    train(config(tiny_model_dir, calc_tasks, async_run, "trainer.mode=async", "trainer.max_staleness=0"))

    sync_eps, async_eps = episode_rows(sync_run), episode_rows(async_run)
    assert len(sync_eps) == len(async_eps) == 3 * 2 * 4
    assert [[e[k] for k in EPISODE_FIELDS] for e in async_eps] == [[e[k] for k in EPISODE_FIELDS] for e in sync_eps]
    for want, got in zip(sync_eps, async_eps):
        assert got["response_logprobs"] == pytest.approx(want["response_logprobs"], abs=1e-5)

    sync_rows = [r for r in read_metrics(sync_run) if "actor/pg_loss" in r]
    async_rows = [r for r in read_metrics(async_run) if "actor/pg_loss" in r]
    assert [r["step"] for r in async_rows] == [r["step"] for r in sync_rows] == [1, 2, 3]
    for want, got in zip(sync_rows, async_rows):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "reward/mean", "adv/std"):
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
        assert got["rollout/staleness_max"] == 0 and got["data/stale_groups_dropped"] == 0
        for key in ("async/buffer_groups", "async/trainer_wait_s", "async/engine_wait_s"):
            assert key in got, key


def versions_of(row: dict) -> list[int]:
    return [v for v, m in zip(row["response_versions"], row["response_mask"]) if m]


def test_async_at_staleness_1_stays_within_the_bound_and_resumes(ray_session, tiny_model_dir, calc_tasks,
                                                                  tmp_path, capsys):
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    extra = ("trainer.mode=async", "trainer.max_staleness=1", "trainer.save_freq=1", "trainer.keep_checkpoints=3",
             "rollout.max_concurrent_episodes=16")
    train(config(tiny_model_dir, calc_tasks, run, *extra))
    uninterrupted = read_metrics(run)
    assert [r["step"] for r in uninterrupted] == [1, 2, 3]
    # Resume after step 1: steps 2 and 3 are trained again and recorded once, in place of the first run's.
    train(config(tiny_model_dir, calc_tasks, run, *extra, f"trainer.resume={run / 'checkpoints' / 'step_000001'}"))
    assert "resuming after step 1 from " in capsys.readouterr().out
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0] == uninterrupted[0]
    episodes = episode_rows(run)
    assert sorted({e["step"] for e in episodes}) == [1, 2, 3]
    for row in rows:
        step_eps = [e for e in episodes if e["step"] == row["step"]]
        assert len(step_eps) == row["data/episodes_generated"] == row["rollout/episodes"]
        groups: dict[str, list[int]] = {}
        for e in step_eps:
            groups.setdefault(e["uid"], []).extend(versions_of(e))
        assert len(set(groups)) == len(step_eps) // 4  # rollout.n episodes per uid: no group twice
        # Weights of step s - 1 were the newest the engine had; a group more than 1 version older was dropped.
        trainer_version = row["step"] - 1
        assert all(max(v) <= trainer_version for v in groups.values() if v)
        stale = sum(1 for v in groups.values() if v and min(v) < trainer_version - 1)
        assert stale == row["data/stale_groups_dropped"]
        assert row["data/groups"] == 2 and len(groups) == 2 + stale
        for e in step_eps:
            assert versions_of(e) == sorted(versions_of(e))  # a turn spanning an update goes on with newer weights
            assert all(v == -1 for v, m in zip(e["response_versions"], e["response_mask"]) if not m)
        if not stale:
            assert row["rollout/staleness_max"] <= 1
        assert row["async/trainer_wait_s"] >= 0 and row["async/engine_wait_s"] >= 0
