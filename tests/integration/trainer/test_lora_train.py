"""LoRA end to end: `agentrl train` with actor.lora on the tiny model (one rank, the KL loss against the adapters
switched off), the LocalEngine sampling step 2 from the merged weights the trainer pushed, adapter-only
checkpoints, a resume that repeats the uninterrupted run, and the exports; then 1 and 2 FSDP ranks give the same
LoRA update."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.config import load_config
from agentrl.trainer.checkpoint import list_checkpoints
from agentrl.trainer.config import ActorConfig, LoraConfig, ModelConfig, TrainConfig
from agentrl.trainer.metrics import read_metrics
from agentrl.types import Episode

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")]


def config(model_dir, tasks, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", "data.val_files=[]",
        "trainer.test_freq=0", "data.train_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=2",
        "agent.max_new_tokens_per_turn=12", "agent.max_response_tokens=40", "agent.max_assistant_turns=2",
        "reward.custom={parity: 'train_rewards:first_token_parity'}", "tools.builtin=[calculator]",
        "actor.lr=1e-2", "actor.warmup_steps=0", "actor.kl_loss_coef=0.1", "actor.lora.rank=8",
        "actor.lora.alpha=16", "trainer.total_steps=2", "trainer.save_freq=1", "trainer.deterministic=true",
        "trainer.loggers=[jsonl]", f"trainer.run_dir={run_dir}", *extra])


def test_lora_run_syncs_merged_weights_checkpoints_adapters_and_resumes(ray_session, tiny_model_dir, calc_tasks,
                                                                       tmp_path):
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.export import export_checkpoint, load_weights
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    train(config(tiny_model_dir, calc_tasks, run))
    rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 and r["actor/skipped_steps"] == 0 for r in rows)
    assert rows[0]["actor/kl_loss"] == 0  # step 1 (one optimizer step): the policy is the base model (B = 0)
    assert rows[1]["actor/kl_loss"] > 0  # the reference (adapters off) stayed behind
    # Step 2 was sampled by the engine from the merged weights of step 1: rollout and trainer logprobs agree.
    assert rows[1]["drift/abs_max"] < 1e-4

    checkpoints = list_checkpoints(run)
    assert [p.name for p in checkpoints] == ["step_000001", "step_000002"]
    saved = load_weights(checkpoints[-1])
    assert saved and all(".lora_A." in name or ".lora_B." in name for name in saved)
    final = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()  # merged, base names
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert final.keys() == initial.keys()
    changed = {name for name in final if not torch.equal(final[name], initial[name])}
    assert changed and all(name.endswith("_proj.weight") for name in changed)  # only the adapted layers moved

    merged = AutoModelForCausalLM.from_pretrained(export_checkpoint(checkpoints[-1], tmp_path / "merged",
                                                                    merged=True)).state_dict()
    for name in final:
        torch.testing.assert_close(merged[name], final[name], atol=1e-6, rtol=0, msg=name)

    uninterrupted = read_metrics(run)
    train(config(tiny_model_dir, calc_tasks, run, f"trainer.resume={checkpoints[0]}"))
    resumed = read_metrics(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted]
    for want, got in zip(uninterrupted, resumed):
        for key in (k for k in want if not k.startswith(("timing/", "perf/"))):
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
    refinal = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    for name in final:
        torch.testing.assert_close(refinal[name], final[name], atol=1e-6, rtol=0, msg=name)


def grouped_episodes(count: int) -> list[Episode]:
    """Groups of 3 sharing a prompt (as in GRPO), ragged responses, some tokens masked."""
    rng = random.Random(7)
    out, prompt = [], []
    for i in range(count):
        if i % 3 == 0:
            prompt = [rng.randrange(3, 2000) for _ in range(rng.randint(3, 10))]
        r = rng.randint(3, 30)
        mask = [1] + [int(rng.random() < 0.8) for _ in range(r - 1)]
        out.append(Episode(uid=f"g{i // 3}", prompt_ids=list(prompt),
                           response_ids=[rng.randrange(3, 2000) for _ in range(r)], response_mask=mask,
                           response_logprobs=[-7.0 * m for m in mask], messages=[], reward=float(i % 3 == 0)))
    return out


def test_one_and_two_ranks_make_the_same_lora_update(ray_session, tiny_model_dir, tmp_path):
    """FSDP2 over gloo shards the PeftModel: 2 ranks give 1 rank's logprobs, reference, gradients, update, merged
    weights and adapter files."""
    from safetensors.torch import load_file

    from agentrl.trainer.batch import episodes_to_batch
    from agentrl.trainer.worker import WorkerGroup

    batch = episodes_to_batch(grouped_episodes(7), pad_token_id=0, advantages=[1.0, -0.5, -0.5, 2.0, -1.0, -1.0, 0.3])
    results = {}
    for world in (1, 2):
        actor = ActorConfig(lr=1e-2, world_size=world, use_kl_loss=True, kl_loss_coef=0.1, grad_clip=1e6,
                            max_tokens_per_micro_batch=64, lora=LoraConfig(rank=4, alpha=8.0))
        group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), actor, with_ref=True, total_steps=10, seed=0)
        try:
            step = batch.clone()
            step["ref_logprobs"], _ = group.compute_logprobs(step, temperature=1.0, ref=True)
            step["old_logprobs"], _ = group.compute_logprobs(step, temperature=1.0)
            grads = group.gradients(step, temperature=1.0)
            metrics = [group.update_policy(step, temperature=1.0, mini_batch_size=7, shuffle=False)
                       for _ in range(2)]
            adapter = load_file(str(group.save_adapter(tmp_path / f"adapter-{world}") / "adapter_model.safetensors"))
            engine = {name: tensor.clone() for name, tensor in group.engine_state_dict().items()}  # shared memory
            results[world] = (step["ref_logprobs"], grads, metrics, engine, adapter)
        finally:
            group.shutdown()
    (ref1, g1, m1, w1, a1), (ref2, g2, m2, w2, a2) = results[1], results[2]
    torch.testing.assert_close(ref2, ref1, atol=1e-5, rtol=0)
    assert any(float(g.abs().sum()) > 0 for g in g1.values())
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], atol=1e-5, rtol=1e-4, msg=name)
    for key in ("pg_loss", "kl_loss", "grad_norm"):
        assert [m[key] for m in m2] == pytest.approx([m[key] for m in m1], abs=1e-5), key
    assert m1[1]["kl_loss"] > 0
    assert list(w2) == list(w1)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-4, msg=name)
    assert a2.keys() == a1.keys()
    for name in a1:
        torch.testing.assert_close(a2[name], a1[name], atol=1e-5, rtol=1e-4, msg=name)


async def test_disk_and_broadcast_sync_serve_the_lora_policy(tiny_model_dir, tmp_path):
    """An SGLang-protocol server (`agentrl engine serve`) given a LoRA policy's merged weights, from the disk and
    over the broadcast group, samples with the trainer's policy."""
    import contextlib
    import sys

    from helpers import free_port, service

    from agentrl.inference.sglang import SGLangEngine
    from agentrl.trainer.batch import episodes_to_batch
    from agentrl.trainer.metrics import drift_metrics
    from agentrl.trainer.weight_sync import broadcast_weights, sync_weights
    from agentrl.trainer.worker import WorkerGroup
    from agentrl.types import SamplingParams

    prompt = [3064, 432, 198, 52, 435, 326, 585, 446, 11, 2538]

    async def drift(group, engine, seed: int) -> float:
        gen = await engine.generate(prompt, SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed))
        n = len(gen.token_ids)
        batch = episodes_to_batch([Episode(uid="u", prompt_ids=prompt, response_ids=gen.token_ids,
                                           response_mask=[1] * n, response_logprobs=gen.logprobs, messages=[])], 0)
        old, _ = group.compute_logprobs(batch, temperature=1.0)
        return drift_metrics(batch["rollout_logprobs"], old, batch["loss_mask"])["drift/abs_max"]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(service([sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model",
                                     str(tiny_model_dir), "--port", str(port)], f"{url}/health", timeout=120))
        group = WorkerGroup(ModelConfig(path=str(tiny_model_dir)),
                            ActorConfig(lr=2e-2, grad_clip=1e6, lora=LoraConfig(rank=4, alpha=8.0)), use_ray=False)
        engine = SGLangEngine([url])
        try:
            batch = episodes_to_batch(grouped_episodes(6), pad_token_id=0, advantages=[1.0, -1.0] * 3)
            batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
            for step in (1, 2):
                for _ in range(3):
                    group.update_policy(batch, temperature=1.0, mini_batch_size=6)
                assert await drift(group, engine, seed=step) > 1e-2  # the server is stale
                if step == 1:
                    await sync_weights(group.engine_state_dict(), engine, backend="sglang",
                                       model_path=str(tiny_model_dir), run_dir=tmp_path, step=step)
                else:
                    await broadcast_weights(group, engine, step=step, token_file=None, bucket_mb=0.5, timeout_s=120)
                assert await drift(group, engine, seed=10 + step) < 1e-4
        finally:
            await engine.close()
            group.shutdown()
