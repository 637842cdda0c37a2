"""LoRA on the FSDP2 policy (one in-process gloo rank): only the adapters train and sit in the optimizer, the
reference is the base model with the adapters off (no second copy), the engines get the adapters merged under the
base model's names, the adapter is written in peft's format, and checkpoints hold the adapters only and resume
exactly."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from agentrl.config import ConfigError, load_config
from agentrl.errors import one_line
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.checkpoint import CheckpointError
from agentrl.trainer.config import ActorConfig, LoraConfig, ModelConfig, TrainConfig
from agentrl.trainer.sft import SFTConfig
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode

LORA = LoraConfig(rank=4, alpha=8.0)


def episodes(count: int, seed: int = 0) -> list[Episode]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        p, r = rng.randint(3, 8), rng.randint(4, 20)
        mask = [1] + [int(rng.random() < 0.8) for _ in range(r - 1)]
        out.append(Episode(uid=f"g{i // 2}", prompt_ids=[rng.randrange(3, 2000) for _ in range(p)],
                           response_ids=[rng.randrange(3, 2000) for _ in range(r)], response_mask=mask,
                           response_logprobs=[-7.0 * m for m in mask], messages=[], reward=float(i % 2)))
    return out


def actor(**changes) -> ActorConfig:
    return ActorConfig(**{"lr": 1e-2, "use_kl_loss": True, "kl_loss_coef": 0.1, "grad_clip": 1e6, "warmup_steps": 0,
                          "max_tokens_per_micro_batch": 100_000, "lora": LORA, **changes})


@pytest.fixture
def batch() -> object:
    return episodes_to_batch(episodes(6), pad_token_id=0, advantages=[1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def policy_step(group, batch) -> dict:
    step = batch.clone()
    step["old_logprobs"], _ = group.compute_logprobs(step, temperature=1.0)
    step["ref_logprobs"], _ = group.compute_logprobs(step, temperature=1.0, ref=True)
    return group.update_policy(step, temperature=1.0, mini_batch_size=6, shuffle=False)


def test_the_lora_keys_load_and_a_bad_value_is_one_line():
    cfg = load_config(TrainConfig, None, ["actor.lora.rank=8"])
    assert (cfg.actor.lora.rank, cfg.actor.lora.alpha, cfg.actor.lora.dropout) == (8, 32.0, 0.0)
    assert cfg.actor.lora.module_names() == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]
    assert load_config(TrainConfig, None, []).actor.lora is None  # full fine-tuning unless asked
    every = load_config(TrainConfig, None, ["actor.lora.target_modules=all-linear"]).actor.lora
    assert every.module_names() == cfg.actor.lora.module_names()
    assert load_config(SFTConfig, None, ["actor.lora.rank=4"]).actor.lora.rank == 4  # agentrl sft: the same keys
    for override, message in (("actor.lora.rank=0", "actor.lora.rank must be >= 1"),
                              ("actor.lora.target_modules=[q_proj,qkv]", "actor.lora.target_modules must be a "
                               "non-empty list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or "
                               "'all-linear'; got ['q_proj', 'qkv']"),
                              ("actor.lora.target_modules=[]", "non-empty list"),
                              ("actor.lora.dropout=1.0", "actor.lora.dropout must be < 1"),
                              ("actor.lora.ranks=4", "did you mean 'actor.lora.rank'?")):
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            load_config(TrainConfig, None, [override])
        assert str(e.value) == one_line(str(e.value))


def test_only_the_adapters_train_and_the_reference_is_the_base_model(tiny_model_dir, batch):
    model = ModelConfig(path=str(tiny_model_dir))
    base = WorkerGroup(model, actor(lora=None), total_steps=10, use_ray=False)
    lora = WorkerGroup(model, actor(), with_ref=True, total_steps=10, use_ray=False)
    try:
        worker = lora.workers[0]
        assert worker.ref is None  # no second copy of the weights
        trained = {name for name, p in worker.model.named_parameters() if p.requires_grad}
        assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
        in_optimizer = {id(p) for group in worker.optimizer.param_groups for p in group["params"]}
        assert in_optimizer == {id(p) for p in worker.model.parameters() if p.requires_grad}
        frozen_before = {name: t.clone() for name, t in worker._gather_state_dict().items() if ".lora_" not in name}

        want, _ = base.compute_logprobs(batch, temperature=1.0)
        policy, _ = lora.compute_logprobs(batch, temperature=1.0)
        ref, _ = lora.compute_logprobs(batch, temperature=1.0, ref=True)
        torch.testing.assert_close(ref, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(policy, want, atol=1e-6, rtol=0)  # B starts at zero: step 0 is the base model

        step = batch.clone()
        step["old_logprobs"], step["ref_logprobs"] = policy, ref
        grads = lora.gradients(step, temperature=1.0)
        assert set(grads) == trained and any(float(g.abs().sum()) > 0 for g in grads.values())
        for _ in range(2):
            assert policy_step(lora, batch)["grad_norm"] > 0
        moved, _ = lora.compute_logprobs(batch, temperature=1.0)
        ref_after, _ = lora.compute_logprobs(batch, temperature=1.0, ref=True)
        assert float((moved - want).abs().max()) > 1e-3
        torch.testing.assert_close(ref_after, want, atol=1e-6, rtol=0)  # the adapters switched off: still the base
        frozen_after = {name: t for name, t in worker._gather_state_dict().items() if ".lora_" not in name}
        assert frozen_after.keys() == frozen_before.keys()
        assert all(torch.equal(frozen_after[name], frozen_before[name]) for name in frozen_before)
    finally:
        lora.shutdown()
        base.shutdown()


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")  # peft asks transformers a deprecated name
def test_engines_get_merged_base_named_weights_and_the_adapter_is_peft_format(tiny_model_dir, batch, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.weight_sync import write_hf_checkpoint

    model = ModelConfig(path=str(tiny_model_dir))
    lora = WorkerGroup(model, actor(), with_ref=True, total_steps=10, use_ray=False)
    try:
        policy_step(lora, batch)
        policy, _ = lora.compute_logprobs(batch, temperature=1.0)
        weights = lora.engine_state_dict()
        again = lora.full_state_dict()
        adapter = lora.save_adapter(tmp_path / "adapter")
        unchanged, _ = lora.compute_logprobs(batch, temperature=1.0)
    finally:
        lora.shutdown()
    assert torch.equal(unchanged, policy)  # merging for the engine left the training weights alone
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert list(weights) == list(hf.state_dict())  # the base model's names, in its order
    assert all(torch.equal(weights[name], again[name]) for name in weights)

    # An engine loading the merged weights computes the trainer's policy logprobs.
    merged_dir = write_hf_checkpoint(weights, tiny_model_dir, tmp_path / "merged")
    engine = WorkerGroup(ModelConfig(path=str(merged_dir)), actor(lora=None), total_steps=10, use_ray=False)
    try:
        served, _ = engine.compute_logprobs(batch, temperature=1.0)
    finally:
        engine.shutdown()
    torch.testing.assert_close(served, policy, atol=1e-5, rtol=0)

    # The adapter as PeftModel.save_pretrained writes it; peft's own merge gives the engine's weights.
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert sorted(config["target_modules"]) == sorted(LORA.module_names())
    assert config["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert all(".default." not in name for name in names)
    peft_merged = PeftModel.from_pretrained(hf, adapter).merge_and_unload().state_dict()
    for name in weights:
        torch.testing.assert_close(weights[name], peft_merged[name], atol=1e-6, rtol=0, msg=name)


def test_adapter_checkpoints_are_small_and_resume_exactly(tiny_model_dir, batch, tmp_path):
    """With adapter dropout (so the restored RNG state matters): 1 step, checkpoint, a fresh group loads it and
    takes 2 more steps = 3 uninterrupted steps."""
    import torch.distributed.checkpoint as dcp

    model = ModelConfig(path=str(tiny_model_dir))
    cfg = actor(lora=LoraConfig(rank=4, alpha=8.0, dropout=0.1))

    def run(steps: int, load: bool = False, save: bool = False):
        group = WorkerGroup(model, cfg, with_ref=True, total_steps=10, use_ray=False)
        try:
            if load:
                group.load_checkpoint(tmp_path / "lora")
            metrics = [policy_step(group, batch) for _ in range(steps)]
            if save:
                group.save_checkpoint(tmp_path / "lora")
            return metrics, group.full_state_dict()
        finally:
            group.shutdown()

    straight, want = run(3)
    first, _ = run(1, save=True)
    rest, got = run(2, load=True)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    for key in ("pg_loss", "kl_loss", "grad_norm", "lr"):
        assert [m[key] for m in first + rest] == [m[key] for m in straight], key

    full = WorkerGroup(model, actor(lora=None), total_steps=10, use_ray=False)
    try:
        full.save_checkpoint(tmp_path / "full")
    finally:
        full.shutdown()
    names = dcp.FileSystemReader(str(tmp_path / "lora" / "actor")).read_metadata().state_dict_metadata
    weights = [name for name in names if name.startswith("model.")]
    assert weights and all(".lora_A." in name or ".lora_B." in name for name in weights)  # adapters only

    def size(path):
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

    assert size(tmp_path / "lora" / "actor") < 0.1 * size(tmp_path / "full" / "actor")

    # a checkpoint of the other kind is one clear error, not a missing-key traceback
    group = WorkerGroup(model, cfg, total_steps=10, use_ray=False)
    try:
        with pytest.raises(CheckpointError, match="holds a full model, but this run trains LoRA adapters"):
            group.load_checkpoint(tmp_path / "full")
    finally:
        group.shutdown()
