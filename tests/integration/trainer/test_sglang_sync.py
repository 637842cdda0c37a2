"""Weight sync to SGLang-protocol servers (`agentrl engine serve` on CPU): the trainer writes an HF checkpoint and
every server loads it with /update_weights_from_disk, after which each samples with the trainer's policy."""

from __future__ import annotations

import contextlib
import sys

import pytest
from helpers import free_port, service

from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, ModelConfig
from agentrl.trainer.metrics import drift_metrics
from agentrl.trainer.weight_sync import sync_weights
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = [3064, 432, 198, 52, 435, 326, 585, 446, 11, 2538]


async def sample(engine, seed: int) -> Episode:
    gen = await engine.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed))
    n = len(gen.token_ids)
    return Episode(uid="u", prompt_ids=PROMPT, response_ids=gen.token_ids, response_mask=[1] * n,
                   response_logprobs=gen.logprobs, messages=[])


def drift(group, episodes: list[Episode]) -> float:
    batch = episodes_to_batch(episodes, pad_token_id=0)
    old, _ = group.compute_logprobs(batch, temperature=1.0)
    return drift_metrics(batch["rollout_logprobs"], old, batch["loss_mask"])["drift/abs_max"]


async def test_every_server_loads_the_synced_weights(tiny_model_dir, tmp_path):
    from agentrl.inference.sglang import SGLangEngine

    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with contextlib.ExitStack() as stack:
        for port, url in zip(ports, urls, strict=True):
            stack.enter_context(service([sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model",
                                         str(tiny_model_dir), "--port", str(port)], f"{url}/health", timeout=120))
        group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), ActorConfig(lr=5e-3, grad_clip=1e6), use_ray=False)
        both = SGLangEngine(urls)
        singles = [SGLangEngine([url]) for url in urls]
        try:
            first = [await sample(engine, seed=1) for engine in singles]
            batch = episodes_to_batch(first, pad_token_id=0, advantages=[1.0, -1.0])
            batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
            for _ in range(3):
                group.update_policy(batch, temperature=1.0, mini_batch_size=2)
            assert drift(group, [await sample(e, seed=2) for e in singles]) > 1e-2  # servers are stale

            await sync_weights(group.full_state_dict(), both, backend="sglang", model_path=str(tiny_model_dir),
                               run_dir=tmp_path, step=1)
            for engine in singles:  # each server on its own
                assert drift(group, [await sample(engine, seed=3)]) < 1e-4
        finally:
            for engine in (both, *singles):
                await engine.close()
            group.shutdown()
