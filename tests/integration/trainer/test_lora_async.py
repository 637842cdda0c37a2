"""LoRA in async mode: after each update the engine samples from the new adapter (verl #7495: the adapter never
reached the engine in async mode). `trainer.mode: async` with `actor.lora`, at max_staleness 0, over the local
engine (merged weights in memory) and over an `agentrl engine serve --enable-lora` server that receives only the
adapter (`engine.lora_sync: adapter`): every step's tokens carry the version of the step before, and the logprobs
the engine reported equal the trainer's policy (drift < 1e-4) although the adapter moves far each step."""

from __future__ import annotations

import json

import httpx
import pytest
from test_train_sglang_servers import SYNC_MODES, config, engine_servers, sampled_drift

from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

ASYNC = ["trainer.mode=async", "trainer.max_staleness=0", "algorithm.rollout_correction.level=token",
         "trainer.total_steps=3"]


def check_run(run) -> None:
    rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["data/infra_failed"] == 0 and row["rollout/staleness_max"] == 0
        assert row["drift/abs_max"] < 1e-4  # sampled by the adapter the trainer had: the newest one
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    for ep in episodes:
        assert {v for v, m in zip(ep["response_versions"], ep["response_mask"]) if m} == {ep["step"] - 1}
    assert rows[-1]["actor/kl"] > 1e-4  # the adapter moved away from the base: a stale one would show in drift


def test_async_lora_over_the_local_engine(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    cfg = config(tiny_model_dir, calc_tasks, run, ["http://127.0.0.1:1"], tmp_path / "unused", SYNC_MODES["disk"],
                 "engine.backend=local", "engine.urls=[]", "engine.token_file=null", "actor.lora.rank=8",
                 "actor.lr=1e-2", "actor.use_kl_loss=true", *ASYNC)
    train(cfg)
    check_run(run)


def test_async_lora_adapter_over_an_sglang_protocol_server(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.loop import train

    mode = SYNC_MODES["adapter"]
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    token_file = tmp_path / "engine.token"
    token_file.write_text("s3cret-engine-token\n")
    token_file.chmod(0o600)
    headers = {"authorization": "Bearer s3cret-engine-token"}
    with engine_servers(tiny_model_dir, run / "weights", token_file, mode, n=1) as urls:
        train(config(tiny_model_dir, calc_tasks, run, urls, token_file, mode, "actor.use_kl_loss=true", *ASYNC))
        check_run(run)
        final = AutoModelForCausalLM.from_pretrained(run / "final_model").eval()
        info = httpx.get(f"{urls[0]}/get_model_info", headers=headers, timeout=10).json()
        assert info["weight_version"] == "policy-v3"
        assert sampled_drift(final, urls[0], headers, **mode.adapter(3)) < 1e-4
