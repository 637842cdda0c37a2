"""`agentrl export`: a trainer checkpoint becomes an HF model directory whose logits are the trained policy's;
`resolve_model_dir` lets a checkpoint stand wherever a model directory is expected; a checkpoint that cannot be
exported is one clear error line."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.errors import one_line
from agentrl.trainer.batch import sft_batch
from agentrl.trainer.checkpoint import CheckpointError, begin_checkpoint
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.export import export_checkpoint, resolve_model_dir
from agentrl.trainer.loop import TaskSampler, save_checkpoint
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Task


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A checkpoint of the tiny model after three optimizer steps, and the weights it holds."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(TrainConfig, None, [f"model.path={tiny_model_dir}", f"trainer.run_dir={run_dir}",
                                          "data.train_batch_size=1", "actor.ppo_mini_batch_size=1", "actor.lr=1e-2"])
    workers = WorkerGroup(cfg.model, cfg.actor, total_steps=3, use_ray=False)
    rng = random.Random(0)
    batch = sft_batch([([rng.randrange(3, 2000) for _ in range(16)], [0] * 4 + [1] * 12) for _ in range(4)], 0)
    for _ in range(3):
        workers.update_sft(batch)
    sampler = TaskSampler([Task(prompt=[{"role": "user", "content": "hi"}])], 1, shuffle=False, seed=0)
    checkpoint = save_checkpoint(cfg, workers, sampler, step=3)
    weights = workers.full_state_dict()
    workers.shutdown()
    return checkpoint, weights


def logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer.encode("What is 12 * 7? Use the calculator.")])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_exported_model_has_the_trained_weights(trained, tiny_model_dir, tmp_path):
    checkpoint, weights = trained
    out = export_checkpoint(checkpoint, tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    initial = logits(reference, tokenizer)
    reference.load_state_dict(weights)
    assert torch.equal(logits(exported, tokenizer), logits(reference, tokenizer))
    assert not torch.equal(logits(exported, tokenizer), initial)  # the checkpoint is not the starting model
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    # readable by the machine's other accounts (an inference server, a colleague): safetensors alone writes 0600
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in out.iterdir()} == {f.name: "0o644" for f in out.iterdir()}


def test_a_checkpoint_resolves_to_a_cached_model_dir(trained, tiny_model_dir):
    checkpoint, _ = trained
    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir
    model_dir = resolve_model_dir(checkpoint)
    assert model_dir == checkpoint / "hf" and (model_dir / "model.safetensors").is_file()
    written = (model_dir / "model.safetensors").stat().st_ino
    assert resolve_model_dir(checkpoint) == model_dir
    assert (model_dir / "model.safetensors").stat().st_ino == written  # exported once


def test_what_cannot_be_exported_is_one_clear_line(trained, tmp_path):
    checkpoint, _ = trained
    run_dir = checkpoint.parent.parent
    half = begin_checkpoint(run_dir, 4)
    cases = {tmp_path / "nope": "does not exist",
             run_dir: f"is a run directory, not a checkpoint; pass one of its checkpoints, e.g. {checkpoint}",
             half: f"is incomplete: it has no COMPLETE file (the run stopped while writing it); the latest complete "
                   f"one is {checkpoint}",
             tmp_path: "is not a trainer checkpoint"}
    for path, expected in cases.items():
        with pytest.raises(CheckpointError) as e:
            export_checkpoint(path, tmp_path / "out")
        assert expected in str(e.value) and str(e.value) == one_line(str(e.value))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        export_checkpoint(checkpoint, tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_eval_takes_a_checkpoint_as_its_model(trained, tmp_path, capsys):
    from agentrl.cli import main

    checkpoint, _ = trained
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(checkpoint), "--suite", "calc", "--num-tasks", "1", "--out", str(out),
                 "-o", "agent.max_response_tokens=8", "-o", "agent.max_assistant_turns=1"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "eval.json").read_text())["model"] == str(checkpoint / "hf")
