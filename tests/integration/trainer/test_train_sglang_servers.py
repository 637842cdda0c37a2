"""End to end: `agentrl train` with `engine.backend: sglang` against two `agentrl engine serve` processes (the CPU
server speaking SGLang's HTTP API), each started as a locked service would be: a bearer token (`--token-file`,
the trainer's `engine.token_file`) and `--weights-dir RUN_DIR/weights`, so the weight sync only loads what the
trainer saves there. Every step is recorded once, both servers sample episodes, and after the run each server
serves the last step's weights, labelled with its number, sampling what the trainer's final policy gives; a new
run on the same servers starts them on its own initial weights. A LoRA policy travels as its adapter alone.

`SYNC_MODES` names each way the weights travel to the servers; a new transport is one more entry."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field

import httpx
import pytest
import torch
from helpers import free_port, service

from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

TOTAL_STEPS = 2
PROMPT = [3064, 432, 198, 52, 435, 326, 585, 446, 11, 2538]


@dataclass(frozen=True)
class SyncMode:
    config: list[str] = field(default_factory=list)  # training config overrides
    serve: list[str] = field(default_factory=list)  # extra `agentrl engine serve` flags
    kept: str | None = "step_{step:06d}"  # what stays under RUN_DIR/weights after step `step` (None: nothing)
    label: str = "{step}"  # the servers' weight_version after step `step`
    lora: bool = False  # the servers serve the policy as a LoRA adapter: requests name it

    def adapter(self, step: int) -> dict:
        return {"lora_path": f"policy-v{step}"} if self.lora else {}


SYNC_MODES = {
    "disk": SyncMode(),  # HF checkpoint under RUN_DIR/weights, then /update_weights_from_disk on every server
    # the trainer's rank 0 (a Ray actor) broadcasts to both servers over gloo, in several buckets
    "broadcast": SyncMode(config=["engine.weight_sync=broadcast", "engine.weight_bucket_mb=0.5"], kept=None),
    # a LoRA policy: only its adapter, written under RUN_DIR/weights and loaded with /load_lora_adapter per step
    "adapter": SyncMode(config=["actor.lora.rank=8", "engine.lora_sync=adapter", "actor.lr=1e-2"],
                        serve=["--enable-lora"], kept="adapter_step_{step:06d}", label="policy-v{step}", lora=True),
}


def config(model_dir, tasks, run_dir, urls, token_file, mode: SyncMode, *extra) -> TrainConfig:
    return load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", "data.val_files=[]",
        "data.train_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=1", "agent.max_new_tokens_per_turn=16",
        "agent.max_response_tokens=64", "agent.max_assistant_turns=2",
        "reward.custom={parity: 'train_rewards:first_token_parity'}", "actor.lr=1e-3", "actor.warmup_steps=0",
        f"trainer.total_steps={TOTAL_STEPS}", "trainer.save_freq=0", "trainer.test_freq=0",
        "trainer.deterministic=true", "trainer.loggers=[jsonl]", "actor.world_size=1", f"trainer.run_dir={run_dir}",
        "engine.backend=sglang", f"engine.urls=[{','.join(urls)}]", f"engine.token_file={token_file}",
        *mode.config, *extra])


@contextlib.contextmanager
def engine_servers(model_dir, weights_dir, token_file, mode: SyncMode, n: int = 2):
    """`n` `agentrl engine serve` processes on free loopback ports; yields their URLs."""
    ports = [free_port() for _ in range(n)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    with contextlib.ExitStack() as stack:
        for port, url in zip(ports, urls, strict=True):
            stack.enter_context(service([
                sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(model_dir),
                "--port", str(port), "--token-file", str(token_file), "--weights-dir", str(weights_dir),
                "--num-threads", "1", *mode.serve], f"{url}/health", timeout=120))
        yield urls


def sampled_drift(model, url: str, headers: dict, **request) -> float:
    """Largest |logprob| difference between what the server at `url` reports for 12 sampled tokens and what
    `model` (HF, float32) gives them."""
    body = {"input_ids": PROMPT, "return_logprob": True, **request,
            "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7}}
    out = httpx.post(f"{url}/generate", json=body, headers=headers, timeout=120).json()
    ids = out["output_ids"]
    served = torch.tensor([lp for lp, _tok, _text in out["meta_info"]["output_token_logprobs"]])
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1:-1].float()
    mine = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    return float((served - mine).abs().max())


@pytest.mark.parametrize("weight_sync", list(SYNC_MODES))
def test_training_run_over_two_locked_sglang_servers(weight_sync, ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.loop import train

    mode = SYNC_MODES[weight_sync]
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)  # the servers' --weights-dir must exist before they start
    token_file = tmp_path / "engine.token"
    token_file.write_text("s3cret-engine-token\n")
    token_file.chmod(0o600)
    headers = {"authorization": "Bearer s3cret-engine-token"}

    with engine_servers(tiny_model_dir, run / "weights", token_file, mode) as urls:
        assert httpx.get(f"{urls[0]}/get_model_info", timeout=10).status_code == 401  # the token is required
        train(config(tiny_model_dir, calc_tasks, run, urls, token_file, mode))

        rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
        assert [r["step"] for r in rows] == list(range(1, TOTAL_STEPS + 1))
        assert sorted(r["step"] for r in read_metrics(run)) == list(range(1, TOTAL_STEPS + 1))  # each step once
        for row in rows:
            assert row["data/infra_failed"] == 0 and row["rollout/episodes"] == 8
            assert row["actor/grad_norm"] > 0
            assert row["drift/abs_max"] < 1e-4  # every step sampled with the weights the trainer had

        episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
        assert sorted({e["step"] for e in episodes}) == list(range(1, TOTAL_STEPS + 1)) and len(episodes) == 16
        for ep in episodes:  # each policy token was sampled by the weights of the step before
            assert {v for v, m in zip(ep["response_versions"], ep["response_mask"]) if m} == {ep["step"] - 1}
        assert {t["server"] for e in episodes for t in e["turns"]} == set(urls)  # both servers sampled episodes

        final = AutoModelForCausalLM.from_pretrained(run / "final_model", torch_dtype=torch.float32).eval()
        initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
        for url in urls:
            info = httpx.get(f"{url}/get_server_info", headers=headers, timeout=10).json()
            assert info["weight_version"] == mode.label.format(step=TOTAL_STEPS)
            assert info["stats"]["prefills"] > 0
            last = mode.adapter(TOTAL_STEPS)
            assert sampled_drift(final, url, headers, **last) < 1e-4  # the server samples the final policy
            assert sampled_drift(initial, url, headers, **last) > 1e-3  # ... which is not the one it started with
        # only the last step's weights stay on disk (none when they were broadcast)
        kept = [] if mode.kept is None else [mode.kept.format(step=TOTAL_STEPS)]
        assert sorted(p.name for p in (run / "weights").iterdir()) == kept

        # A new run on the same servers (the earlier run moved aside) first replaces the weights they serve, the
        # earlier run's last step, with its initial ones: its step 1 samples the policy it trains.
        train(config(tiny_model_dir, calc_tasks, run, urls, token_file, mode, "trainer.resume=never",
                     "trainer.total_steps=1", "trainer.save_hf_model=false"))
        assert (tmp_path / "run.old-1" / "final_model").is_dir()
        (row,) = [r for r in read_metrics(run) if "actor/pg_loss" in r]
        assert row["step"] == 1 and row["drift/abs_max"] < 1e-4 and row["rollout/staleness_max"] == 0
        for url in urls:
            info = httpx.get(f"{url}/get_model_info", headers=headers, timeout=10).json()
            assert info["weight_version"] == mode.label.format(step=1)
