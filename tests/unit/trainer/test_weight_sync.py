"""After a weight sync the engine samples with exactly the trainer's policy (in memory and through disk)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import InfraFailureError, WeightSyncTimeoutError, one_line
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, ModelConfig, TrainConfig
from agentrl.trainer.metrics import drift_metrics
from agentrl.trainer.weight_sync import push_weights, sync_weights, write_hf_checkpoint
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode, SamplingParams

PROMPT = [3064, 432, 198, 52, 435, 326, 585, 446, 11, 2538]


async def engine_episode(engine, seed: int) -> Episode:
    gen = await engine.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed))
    n = len(gen.token_ids)
    return Episode(uid="u", prompt_ids=PROMPT, response_ids=gen.token_ids, response_mask=[1] * n,
                   response_logprobs=gen.logprobs, messages=[], turn_ids=[0] * n)


def drift(group, episode: Episode) -> float:
    batch = episodes_to_batch([episode], pad_token_id=0)
    old, _ = group.compute_logprobs(batch, temperature=1.0)
    return drift_metrics(batch["rollout_logprobs"], old, batch["loss_mask"], batch["turn_ids"])["drift/abs_max"]


async def test_sync_makes_engine_logprobs_match_the_trainer(tiny_model_dir, tmp_path):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), ActorConfig(lr=5e-3, grad_clip=1e6), use_ray=False)
    engine = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=4))
    try:
        ep = await engine_episode(engine, seed=1)
        assert drift(group, ep) < 1e-4  # same weights, same fp32 math
        batch = episodes_to_batch([ep, await engine_episode(engine, seed=2)], pad_token_id=0, advantages=[1.0, -1.0])
        batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
        for _ in range(3):
            group.update_policy(batch, temperature=1.0, mini_batch_size=2)
        assert drift(group, await engine_episode(engine, seed=3)) > 1e-2  # engine is stale now

        await sync_weights(group.full_state_dict(), engine, backend="local", model_path=str(tiny_model_dir),
                           run_dir=tmp_path, step=1)
        assert drift(group, await engine_episode(engine, seed=4)) < 1e-4
        # the weights are numbered by the step that made them, and so are the tokens they sample
        gen = await engine.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=1.0, seed=4))
        assert engine.weight_version == 1 and gen.weight_versions == [1] * len(gen.token_ids)

        group.update_policy(batch, temperature=1.0, mini_batch_size=2)
        metrics = await sync_weights(group.full_state_dict(), engine, backend="sglang",
                                     model_path=str(tiny_model_dir), run_dir=tmp_path, step=2)
        assert "timing/weight_write_s" in metrics
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["step_000002"]
        assert drift(group, await engine_episode(engine, seed=5)) < 1e-4
        assert engine.weight_version == 2
    finally:
        await engine.close()
        group.shutdown()


def test_hf_checkpoint_stores_tied_weights_once_and_loads(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    state = {k: v.clone() + 0.5 for k, v in model.state_dict().items()}
    out = write_hf_checkpoint(state, tiny_model_dir, tmp_path / "w")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(out / "model.safetensors")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(reloaded.model.embed_tokens.weight, state["model.embed_tokens.weight"])
    assert (out / "tokenizer.json").is_file() and not (tmp_path / "w.tmp").exists()


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="weight sync supports"):
        asyncio.run(sync_weights({}, None, backend="vllm", model_path="", run_dir=".", step=0))


class _StuckEngine:
    """An engine whose weight update never finishes (a hung server), recording what it was asked."""

    def __init__(self):
        self.calls: list[dict] = []

    async def update_weights(self, weights, *, version: int, on_running: str = "continue") -> None:
        self.calls.append({"version": version, "on_running": on_running})
        await asyncio.Event().wait()  # nothing ever sets it


class _Workers:
    def engine_state_dict(self) -> dict:
        return {"w": torch.zeros(1)}


@pytest.mark.parametrize("during_rollout", [False, True])
async def test_a_weight_push_that_never_finishes_stops_with_one_line_naming_the_timeout(during_rollout, tmp_path):
    cfg = load_config(TrainConfig, overrides=["trainer.weight_sync_timeout_s=0.01", f"trainer.run_dir={tmp_path}",
                                              "rollout.on_weight_update=abort"])
    engine = _StuckEngine()
    with pytest.raises(WeightSyncTimeoutError) as caught:
        await push_weights(_Workers(), engine, cfg, 7, during_rollout=during_rollout)
    message = str(caught.value)
    assert isinstance(caught.value, InfraFailureError)  # the CLI prints it as one `error:` line, exit code 3
    assert one_line(message) == message
    assert "step 7" in message and "engine.backend local" in message
    assert "trainer.weight_sync_timeout_s=0.01" in message and "raise the timeout" in message
    # async mode passes rollout.on_weight_update to the engine; sync mode pushes to an idle engine
    assert engine.calls == [{"version": 7, "on_running": "abort" if during_rollout else "continue"}]


@pytest.mark.parametrize(("labels", "foreign"), [(["default", "default"], []), (["default", "4"], ["4"]),
                                                 (["4", "4"], ["4"])])
async def test_a_fresh_run_finds_servers_that_serve_an_earlier_runs_weights(labels, foreign):
    """SGLang servers reused from an earlier run serve its last step (label "4"): a fresh run must push its own
    initial weights before step 1 samples, else it trains on episodes of another policy (and the staleness check
    finds a version newer than the trainer's)."""
    import httpx

    from agentrl.inference import EngineConfig
    from agentrl.inference.sglang import SGLangEngine
    from agentrl.trainer.loop import foreign_weight_labels

    urls = ["http://s0:30000", "http://s1:30000"]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "m", "weight_version": labels[urls.index(
                f"http://{request.url.host}:{request.url.port}")]})
        return httpx.Response(200, json={})

    engine = SGLangEngine(urls, EngineConfig(backend="sglang", urls=urls), transport=httpx.MockTransport(answer))
    cfg = load_config(TrainConfig, overrides=["engine.backend=sglang", f"engine.urls=[{','.join(urls)}]"])
    try:
        assert await engine.weight_labels() == labels
        assert await foreign_weight_labels(engine, cfg) == foreign
    finally:
        await engine.close()
    assert await foreign_weight_labels(None, load_config(TrainConfig, overrides=[])) == []  # local: nothing to ask
