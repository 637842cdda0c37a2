"""Weights from the trainer to `agentrl engine serve` servers over a gloo process group (SGLang's
/init_weights_update_group + /update_weights_from_distributed), no disk: each server then samples with the
trainer's policy; the group stays open between updates; a dead or refusing server is an error naming it, never a
hang."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import httpx
import pytest
from helpers import free_port, service

from agentrl.inference import EngineConfig
from agentrl.inference.sglang import SGLangEngine
from agentrl.inference.weight_broadcast import BroadcastError
from agentrl.models.tiny import build_tiny_model
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, ModelConfig
from agentrl.trainer.metrics import drift_metrics
from agentrl.trainer.weight_sync import broadcast_weights
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = [3064, 432, 198, 52, 435, 326, 585, 446, 11, 2538]
TOKEN = "s3cret-broadcast-token"


async def drift(group, engine, seed: int) -> float:
    gen = await engine.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed))
    n = len(gen.token_ids)
    episode = Episode(uid="u", prompt_ids=PROMPT, response_ids=gen.token_ids, response_mask=[1] * n,
                      response_logprobs=gen.logprobs, messages=[])
    batch = episodes_to_batch([episode], pad_token_id=0)
    old, _ = group.compute_logprobs(batch, temperature=1.0)
    return drift_metrics(batch["rollout_logprobs"], old, batch["loss_mask"])["drift/abs_max"]


def train_a_little(group) -> None:
    batch = episodes_to_batch([Episode(uid="u", prompt_ids=PROMPT, response_ids=[7, 8, 9], response_mask=[1] * 3,
                                       response_logprobs=[-1.0] * 3, messages=[])], pad_token_id=0, advantages=[1.0])
    batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
    group.update_policy(batch, temperature=1.0, mini_batch_size=1)


@contextlib.contextmanager
def servers(model_dir, token_file, count: int = 2):
    with contextlib.ExitStack() as stack:
        urls, procs = [], []
        for _ in range(count):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            procs.append(stack.enter_context(service(
                [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(model_dir), "--port",
                 str(port), "--token-file", str(token_file)], f"{url}/health", timeout=120)))
            urls.append(url)
        yield urls, procs


def client(urls: list[str], token_file) -> SGLangEngine:
    return SGLangEngine(urls, EngineConfig(backend="sglang", urls=urls, token_file=str(token_file)))


def push(group, engine, step: int, token_file, timeout_s: float = 60.0):
    return broadcast_weights(group, engine, step=step, token_file=str(token_file), bucket_mb=0.5,
                             timeout_s=timeout_s)


async def test_broadcast_reaches_every_server_and_reuses_its_group(tiny_model_dir, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), ActorConfig(lr=5e-3, grad_clip=1e6), use_ray=False)
    with servers(tiny_model_dir, token_file) as (urls, _):
        both = client(urls, token_file)
        singles = [client([url], token_file) for url in urls]
        try:
            for step in (1, 2):
                for _ in range(3):
                    train_a_little(group)
                assert await drift(group, singles[0], seed=step) > 1e-2  # the servers are stale
                metrics = await push(group, both, step, token_file)
                assert metrics["weight_sync/group_opened"] == (1.0 if step == 1 else 0.0)
                assert metrics["weight_sync/buckets"] > 1  # 0.5 MiB buckets: the update came in several
                for engine in singles:  # each server on its own samples with the trainer's policy
                    assert await drift(group, engine, seed=10 + step) < 1e-4
                    info = httpx.get(f"{engine.urls[0]}/get_server_info",
                                     headers={"Authorization": f"Bearer {TOKEN}"}).json()
                    assert info["weight_version"] == str(step)
                assert both.weight_version == step
        finally:
            for engine in (both, *singles):
                await engine.close()
            group.shutdown()


async def test_a_dead_server_fails_the_push_by_name_and_the_next_push_opens_a_new_group(tiny_model_dir, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), ActorConfig(lr=5e-3, grad_clip=1e6), use_ray=False)
    with servers(tiny_model_dir, token_file) as (urls, procs):
        engine = client(urls, token_file)
        try:
            await push(group, engine, 1, token_file)
            os.killpg(procs[1].pid, signal.SIGKILL)
            procs[1].wait()
            with pytest.raises(BroadcastError) as err:
                await push(group, engine, 2, token_file, timeout_s=20.0)
            assert "\n" not in str(err.value) and engine.weight_version == 1  # the failed update changed nothing
            survivor = client(urls[:1], token_file)
            train_a_little(group)
            metrics = await push(group, survivor, 3, token_file)  # the server left gets a group of its own
            assert metrics["weight_sync/group_opened"] == 1.0
            assert await drift(group, survivor, seed=5) < 1e-4
            await survivor.close()
        finally:
            await engine.close()
            group.shutdown()


@pytest.mark.parametrize(("trainer_deeper", "refusal"), [
    (True, r"model.layers.2.* is not a parameter"),  # names the server does not have: the first bucket is refused
    (False, r"the update ended \(weight_version 1\) without \d+ parameters of this model")])  # names left out
async def test_a_server_of_another_model_refuses_the_update_by_name(tiny_model_dir, tmp_path, trainer_deeper, refusal):
    deeper = build_tiny_model(tmp_path / "three-layers", size="tiny3", seed=0)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    trained, served = (deeper, tiny_model_dir) if trainer_deeper else (tiny_model_dir, deeper)
    group = WorkerGroup(ModelConfig(path=str(trained)), ActorConfig(lr=5e-3, grad_clip=1e6), use_ray=False)
    with servers(served, token_file, count=1) as (urls, _):
        engine = client(urls, token_file)
        try:
            refused = rf"{urls[0]}/update_weights_from_distributed: HTTP 400: .*{refusal}"
            with pytest.raises(BroadcastError, match=refused):
                await push(group, engine, 1, token_file)
            assert engine.weight_version == 0
        finally:
            await engine.close()
            group.shutdown()
