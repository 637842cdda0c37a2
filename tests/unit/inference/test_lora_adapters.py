"""Reading peft adapters and merging them (agentrl/inference/lora_adapters.py) against peft's own merge_and_unload,
and the one-line refusals of adapter directories that cannot be served."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import peft_lora_model
from safetensors.torch import load_file, save_file

from agentrl.inference.lora_adapters import AdapterError, merged_weights, read_peft_adapter
from agentrl.inference.lora_serving import tied_weights

peft = pytest.importorskip("peft", reason="peft builds the reference adapters")

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _base(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adapter") / "policy"
    peft_lora_model(tiny_model_dir, seed=0, target_modules=ALL_LINEAR).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def base_weights(tiny_model_dir) -> dict[str, torch.Tensor]:
    return _base(tiny_model_dir).state_dict()


@pytest.mark.parametrize("config", [
    {},
    {"use_rslora": True},
    {"r": 6, "rank_pattern": {"down_proj": 2}, "alpha_pattern": {"self_attn.q_proj": 3}},
], ids=["plain", "rslora", "patterns"])
def test_merge_equals_peft_merge_and_unload(tiny_model_dir, tmp_path, base_weights, config):
    model = peft_lora_model(tiny_model_dir, seed=1, target_modules=ALL_LINEAR, **config)
    model.save_pretrained(tmp_path / "a")
    adapter = read_peft_adapter(tmp_path / "a", base_weights, tied=tied_weights(base_weights))
    assert len(adapter.modules) == 2 * len(ALL_LINEAR) and adapter.target_modules == set(ALL_LINEAR)
    ranks = {m.weight.split(".")[-2]: m.rank for m in adapter.modules}
    assert ranks["down_proj"] == (2 if "rank_pattern" in config else config.get("r", 4))
    merged = merged_weights(base_weights, adapter)
    reference = model.merge_and_unload().state_dict()
    changed = 0
    for name, tensor in base_weights.items():
        torch.testing.assert_close(merged.get(name, tensor), reference[name], rtol=0, atol=1e-6, msg=name)
        changed += not torch.equal(merged.get(name, tensor), tensor)
    assert changed == 2 * len(ALL_LINEAR)  # every adapted weight moved, nothing else did


def _drop_weights(d: Path) -> None:
    (d / "adapter_model.safetensors").unlink()


def _bin_weights(d: Path) -> None:
    (d / "adapter_model.safetensors").rename(d / "adapter_model.bin")


def _nested(d: Path) -> None:  # peft's save_pretrained of an adapter not named "default"
    (d / "policy").mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (d / name).rename(d / "policy" / name)


def _edit_tensors(d: Path, edit) -> None:
    tensors = load_file(d / "adapter_model.safetensors")
    edit(tensors)
    save_file(tensors, d / "adapter_model.safetensors")


def _edit_config(d: Path, **changes) -> None:
    config = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**config, **changes}))


Q = "base_model.model.model.layers.0.self_attn.q_proj"
BROKEN = {
    "no weights file": (_drop_weights, "has no adapter_model.safetensors"),
    "bin weights": (_bin_weights, "safe_serialization=True"),
    "nested adapter": (_nested, "subdirectory: pass"),
    "bad json": (lambda d: (d / "adapter_config.json").write_text("{r: 4"), "not valid JSON"),
    "not lora": (lambda d: _edit_config(d, peft_type="IA3"), "peft_type is 'IA3'"),
    "dora": (lambda d: _edit_config(d, use_dora=True), "use_dora=True is not supported"),
    "wrong r": (lambda d: _edit_config(d, r=8), "rank 8 on this model's [128, 384] weight needs [8, 384] and [128, 8]"),
    "unknown module": (lambda d: _edit_tensors(d, lambda t: t.update(
        {k.replace("layers.0.", "layers.9."): t.pop(k) for k in list(t) if "layers.0.self_attn.q_proj" in k})),
        "model.layers.9.self_attn.q_proj.weight"),
    "missing lora_B": (lambda d: _edit_tensors(d, lambda t: t.pop(f"{Q}.lora_B.weight")), "but not lora_B"),
    "bias key": (lambda d: _edit_tensors(d, lambda t: t.update({f"{Q}.bias": torch.zeros(128)})),
                 f"key {Q}.bias is not a lora_A/lora_B weight"),
    "empty": (lambda d: _edit_tensors(d, lambda t: t.clear()), "holds no LoRA weights"),
    "other base copy": (lambda d: _edit_tensors(d, lambda t: t.update({f"{Q}.base_layer.weight": torch.zeros(
        128, 128)})), "holds a copy of model.layers.0.self_attn.q_proj.weight that differs from this model's"),
}


def test_a_copy_of_the_unchanged_base_weight_is_accepted(adapter_dir, tmp_path, base_weights):
    """peft saves the base weight of an adapted lm_head (save_embedding_layers); an untied one is served."""
    shutil.copytree(adapter_dir, tmp_path / "a")
    own = base_weights["model.layers.0.self_attn.q_proj.weight"]
    _edit_tensors(tmp_path / "a", lambda t: t.update({f"{Q}.base_layer.weight": own.clone()}))
    assert len(read_peft_adapter(tmp_path / "a", base_weights).modules) == 2 * len(ALL_LINEAR)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_adapter_directory_is_refused_in_one_line(adapter_dir, tmp_path, base_weights, case):
    breaks, expected = BROKEN[case]
    broken = tmp_path / "broken"
    shutil.copytree(adapter_dir, broken)
    breaks(broken)
    with pytest.raises(AdapterError) as err:
        read_peft_adapter(broken, base_weights, tied=tied_weights(base_weights))
    message = str(err.value)
    assert expected in message and "\n" not in message, message


def test_a_tied_lm_head_is_not_a_target(tiny_model_dir, tmp_path, base_weights):
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= tied_weights(base_weights)  # the tiny model ties them
    peft_lora_model(tiny_model_dir, seed=0, target_modules=["lm_head"]).save_pretrained(tmp_path / "head")
    with pytest.raises(AdapterError, match="lm_head.weight is tied to another weight"):
        read_peft_adapter(tmp_path / "head", base_weights, tied=tied_weights(base_weights))


def test_a_missing_directory_names_itself(tmp_path, base_weights):
    with pytest.raises(AdapterError, match=f"{tmp_path / 'nowhere'} is not a directory"):
        read_peft_adapter(tmp_path / "nowhere", base_weights)
