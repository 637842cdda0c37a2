"""The hand-set induction circuit: a `copy`-initialised model continues repeated spans before any training."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.models.tiny import build_tiny_model


def _repeated_spans(tokenizer, rng: random.Random) -> tuple[list[int], list[int]]:
    """Spans of random tokens or digits at random places, then again in another order; mask = the repeats'
    tokens after their first (only in-context copying can predict them)."""
    pool = list(range(256, 3000))
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    spans = [rng.choices(pool if rng.random() < 0.5 else digits, k=rng.randint(3, 8)) for _ in range(4)]
    ids, mask = [], []
    for span in spans:
        filler = rng.choices(pool, k=3)
        ids += filler + span
        mask += [0] * (len(filler) + len(span))
    rng.shuffle(spans)
    for span in spans:
        filler = rng.choices(pool, k=3)
        ids += filler + span
        mask += [0] * (len(filler) + 1) + [1] * (len(span) - 1)
    return ids, mask


def _copy_accuracy(model_dir) -> float:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rng = random.Random(1)
    right = total = 0
    for _ in range(12):
        ids, mask = _repeated_spans(tokenizer, rng)
        with torch.no_grad():
            predicted = model(torch.tensor([ids])).logits[0].argmax(-1)
        for t in range(1, len(ids)):
            if mask[t]:
                total += 1
                right += int(predicted[t - 1].item() == ids[t])
    return right / total


@pytest.mark.parametrize("size,at_least", [("tiny", 0.6), ("tiny3", 0.6), ("small", 0.8)])
def test_copy_init_continues_repeated_spans_untrained(tmp_path, size, at_least):
    copy = _copy_accuracy(build_tiny_model(tmp_path / "copy", size=size, init="copy"))
    random_init = _copy_accuracy(build_tiny_model(tmp_path / "random", size=size, init="random"))
    assert copy >= at_least, f"{size}: copy-initialised model continues only {copy:.0%} of repeated tokens"
    assert random_init < 0.05, f"{size}: a random model should not copy ({random_init:.0%})"


def test_copy_init_is_deterministic_and_trainable(tmp_path):
    a = build_tiny_model(tmp_path / "a", size="tiny", init="copy")
    b = build_tiny_model(tmp_path / "b", size="tiny", init="copy")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    model = AutoModelForCausalLM.from_pretrained(a)
    ids = torch.tensor([[300, 301, 302, 300, 301]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    zero_init = model.model.layers[1].mlp.down_proj.weight  # zero at init, must still receive gradient
    assert zero_init.grad is not None and zero_init.grad.abs().sum() > 0


def test_tiny3_third_layer_starts_as_identity(tmp_path):
    """tiny3's extra layer adds nothing to the residual stream at init: the copy circuit reaches the LM head as in
    tiny, and the layer's attention and MLP inputs stay random so training can switch it on."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, size="tiny3", init="copy"))
    third = model.model.layers[2]
    assert not third.self_attn.o_proj.weight.any() and not third.mlp.down_proj.weight.any()
    assert third.self_attn.q_proj.weight.abs().sum() > 0 and third.mlp.up_proj.weight.abs().sum() > 0


def test_unknown_init_names_choices(tmp_path):
    with pytest.raises(ValueError, match="random"):
        build_tiny_model(tmp_path, size="tiny", init="pretrained")
