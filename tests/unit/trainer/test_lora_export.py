"""What leaves a LoRA run: `agentrl export` writes a checkpoint's adapter in peft's format, or with --merged a plain
HF model with the trained policy's logits; `agentrl eval` takes the checkpoint as a model; a resume with other
LoRA keys stops naming them; `agentrl sft` with actor.lora saves the merged model and the adapter."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from agentrl.config import load_config
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.checkpoint import CheckpointError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.export import export_checkpoint, resolve_model_dir
from agentrl.trainer.loop import TaskSampler, save_checkpoint
from agentrl.trainer.resume import ResumeConfigError, check_resume_config
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode, Task

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")  # peft asks a deprecated name


def train_config(model_dir, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, None, [f"model.path={model_dir}", f"trainer.run_dir={run_dir}",
                                           "data.train_batch_size=1", "actor.ppo_mini_batch_size=1", "actor.lr=1e-2",
                                           "actor.lora.rank=4", "actor.lora.alpha=16", *extra])


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A LoRA run's checkpoint after three PPO updates on one batch, and the merged weights its engine got."""
    cfg = train_config(tiny_model_dir, tmp_path_factory.mktemp("run"))
    workers = WorkerGroup(cfg.model, cfg.actor, total_steps=3, use_ray=False)
    try:
        rng = random.Random(0)
        responses = [[rng.randrange(3, 2000) for _ in range(12)] for _ in range(4)]
        rows = [Episode(uid=f"g{i // 2}", prompt_ids=[7, 8, 9], response_ids=ids, response_mask=[1] * 12,
                        response_logprobs=[-7.0] * 12, messages=[]) for i, ids in enumerate(responses)]
        batch = episodes_to_batch(rows, pad_token_id=0, advantages=[1.0, -1.0, 2.0, -2.0])
        batch["old_logprobs"], _ = workers.compute_logprobs(batch, temperature=1.0)
        for _ in range(3):
            workers.update_policy(batch, temperature=1.0, mini_batch_size=4)
        sampler = TaskSampler([Task(prompt=[{"role": "user", "content": "2 + 2?"}])], 1, shuffle=False, seed=0)
        return save_checkpoint(cfg, workers, sampler, step=3), workers.engine_state_dict(), cfg
    finally:
        workers.shutdown()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[5, 300, 17, 1200, 40, 9]])).logits


def test_export_writes_the_adapter_and_merged_gives_the_trained_policy(trained, tiny_model_dir, tmp_path, capsys):
    from peft import PeftModel

    from agentrl.trainer.export import _main  # the CLI's handler

    checkpoint, weights, _ = trained
    adapter = export_checkpoint(checkpoint, tmp_path / "adapter")
    files = sorted(p.name for p in adapter.iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(files)
    assert "config.json" not in files and "model.safetensors" not in files
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4

    trained_policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained_policy.load_state_dict(weights)
    want = logits(trained_policy)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.allclose(logits(base), want, atol=1e-4)  # the adapter moved the policy
    torch.testing.assert_close(logits(PeftModel.from_pretrained(base, adapter)), want, atol=1e-5, rtol=0)

    merged = export_checkpoint(checkpoint, tmp_path / "merged", merged=True)
    assert not (merged / "adapter_config.json").exists()
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(merged)), want, atol=1e-5, rtol=0)
    # whatever takes a model directory takes the checkpoint: exported merged, once
    resolved = resolve_model_dir(checkpoint)
    assert resolved == checkpoint / "hf"
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(resolved)), want, atol=1e-5, rtol=0)

    import argparse

    _main(argparse.Namespace(checkpoint=str(checkpoint), out=str(tmp_path / "cli"), merged=False))
    out = capsys.readouterr().out
    assert f"its LoRA adapter to {tmp_path / 'cli'}; load it with PeftModel.from_pretrained(" in out


def test_merged_export_without_the_base_model_says_so(trained, tmp_path):
    import shutil

    checkpoint, _, _ = trained
    copy = tmp_path / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, copy, ignore=shutil.ignore_patterns("hf"))
    saved = yaml.safe_load((copy / "config.yaml").read_text())
    saved["model"]["path"] = str(tmp_path / "gone")
    (copy / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(CheckpointError, match=r"holds LoRA adapters of the model at .*gone, which is not there any "
                                              r"more: --merged needs those base weights"):
        export_checkpoint(copy, tmp_path / "out", merged=True)
    assert (export_checkpoint(copy, tmp_path / "adapter") / "adapter_model.safetensors").is_file()


def test_resume_with_other_lora_keys_names_them(trained, tiny_model_dir, tmp_path):
    checkpoint, _, _ = trained
    with pytest.raises(ResumeConfigError, match=r"actor.lora.rank \(4 -> 8\)"):
        check_resume_config(train_config(tiny_model_dir, tmp_path, "actor.lora.rank=8"), checkpoint)
    full = load_config(TrainConfig, None, [f"model.path={tiny_model_dir}", f"trainer.run_dir={tmp_path}",
                                           "data.train_batch_size=1", "actor.ppo_mini_batch_size=1", "actor.lr=1e-2"])
    with pytest.raises(ResumeConfigError, match=r"actor.lora.rank \(4 -> None\), actor.lora.alpha \(16.0 -> None\)"):
        check_resume_config(full, checkpoint)
    check_resume_config(train_config(tiny_model_dir, tmp_path, "actor.lora.dropout=0.05"), checkpoint)  # free


def test_sft_with_lora_saves_the_merged_model_and_the_adapter(tiny_model_dir, tmp_path):
    from agentrl.trainer.sft import SFTConfig, run_sft

    demo = {"messages": [{"role": "user", "content": "What is 2 + 2?"},
                         {"role": "assistant", "content": "<answer>4</answer>"}], "tools": None}
    (tmp_path / "demos.jsonl").write_text(json.dumps(demo) + "\n" + json.dumps(demo) + "\n")
    cfg = load_config(SFTConfig, "configs/sft/tiny_cpu.yaml", [
        f"model.path={tiny_model_dir}", f"data.train_files=[{tmp_path / 'demos.jsonl'}]", "sft.epochs=6",
        "sft.batch_size=2", f"sft.run_dir={tmp_path / 'run'}", "actor.warmup_steps=0", "actor.lr=0.02",
        "sft.log_freq=100", "actor.lora.rank=8"])
    result = run_sft(cfg)
    metrics = (tmp_path / "run" / "sft_metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["sft_loss"] for line in metrics]
    assert losses[-1] < losses[0] - 0.5  # the adapters learn (8.1 -> 7.1 nats here)
    out = tmp_path / "run" / "model"
    assert result["output_dir"] == str(out)
    model = AutoModelForCausalLM.from_pretrained(out)  # a plain model: the adapter merged in
    assert not torch.equal(logits(model), logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir)))
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 8
