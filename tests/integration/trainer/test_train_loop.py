"""End to end: `agentrl train`'s loop on the tiny model with a real HTTP tool service, the LocalEngine and two
Ray FSDP ranks (sharded checkpoints); then a resume from the step-1 checkpoint must reproduce step 2."""

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
def calc_tasks(tmp_path_factory):
    """Calc-suite prompts scored by the parity of the first sampled token, so a random model's groups differ."""
    from agentrl.data.suites import write_suite

    root = tmp_path_factory.mktemp("calc")
    paths = {}
    for split, n in (("train", 16), ("heldout", 4)):
        raw = write_suite("calc", split, n, root / f"raw-{split}.jsonl", seed=0)[0]
        rows = [json.loads(line) for line in raw.read_text().splitlines()]
        for row in rows:
            row["reward"] = {"type": "parity"}
        paths[split] = root / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


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


def test_two_step_grpo_run_and_exact_resume(ray_session, tiny_model_dir, calc_tasks, calculator_service, tmp_path):
    from agentrl.trainer.loop import train

    run_a = tmp_path / "a"
    train(config(tiny_model_dir, calc_tasks, calculator_service, run_a))

    rows = [r for r in read_metrics(run_a) if "actor/pg_loss" in r]
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
    assert any(k.startswith("val/reward/mean") for r in read_metrics(run_a) for k in r)
    assert [p.name for p in list_checkpoints(run_a)] == ["step_000001", "step_000002"]
    assert (run_a / "config.yaml").is_file() and (run_a / "episodes.jsonl").is_file()
    # The trained policy is exported as a plain HF model dir, identical to the final checkpoint's weights.
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run_a / "final_model")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moved = [not torch.equal(a, b) for a, b in zip(final.state_dict().values(), initial.state_dict().values())]
    assert any(moved)

    run_b = tmp_path / "b"
    train(config(tiny_model_dir, calc_tasks, calculator_service, run_b,
                 f"trainer.resume={run_a / 'checkpoints' / 'step_000001'}"))
    resumed = [r for r in read_metrics(run_b) if "actor/pg_loss" in r]
    assert [r["step"] for r in resumed] == [2]
    want, got = comparable(rows[1]), comparable(resumed[0])
    assert want.keys() == got.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-5), key
