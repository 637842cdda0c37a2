"""LoRA adapters in peft's on-disk format, read and merged into a model's weights for serving.

The format is what peft's `PeftModel.save_pretrained` writes (peft 0.21): a directory holding
`adapter_config.json` and `adapter_model.safetensors`, whose keys are `base_model.model.<module>.lora_A.weight`
[r, in_features] and `base_model.model.<module>.lora_B.weight` [out_features, r] for each adapted linear layer
`<module>` of the base model (e.g. `model.layers.0.self_attn.q_proj`). The weight served for `<module>` is

    W' = W + scaling * (B @ A),   scaling = lora_alpha / r   (use_rslora: lora_alpha / sqrt(r))

computed in float32 and stored in W's dtype, which is what peft's `merge_and_unload` gives. A module's own rank
or alpha from `rank_pattern` / `alpha_pattern` is found as peft finds it: a pattern matching the end of the
module's name at a dot boundary.

Refused with one line naming the directory, the key or setting, and the fix (`AdapterError`): a missing file,
weights saved as .bin, a config that is not LoRA or asks for what a weight merge here does not do (DoRA,
lora_bias, fan_in_fan_out, modules_to_save, trainable tokens, target_parameters, aLoRA, ...), a key that is not
a lora_A / lora_B weight of a linear layer (embedding adapters, biases), a module the model lacks, a rank or
shape that does not fit, and a target whose weight is tied to another (lm_head tied to the embeddings: merging
into it would change the embeddings too).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# a full copy of an adapted layer's base weight (peft's save_embedding_layers, when lm_head or embeddings are targets)
_BASE_COPY = re.compile(r"^base_model\.model\.(?P<module>.+)\.base_layer\.weight$")

# adapter_config.json settings a merge of A and B cannot honour, with the values that mean "not used"
_UNSUPPORTED = {
    "use_dora": (False, None), "lora_bias": (False, None), "fan_in_fan_out": (False, None),
    "modules_to_save": (None, []), "trainable_token_indices": (None, [], {}), "target_parameters": (None, []),
    "alora_invocation_tokens": (None, []), "use_qalora": (False, None), "use_bdlora": (False, None),
    "layer_replication": (None, []), "arrow_config": (None,), "bias": ("none", None),
}


class AdapterError(ValueError):
    """An adapter directory that cannot be served; the message is one line naming what and how to fix it."""


@dataclass(frozen=True)
class LoraModule:
    """One adapted linear layer: the weight it changes, its factors and its scaling."""

    weight: str  # name of the base weight in the model's state dict, e.g. model.layers.0.self_attn.q_proj.weight
    A: torch.Tensor  # [r, in_features], float32
    B: torch.Tensor  # [out_features, r], float32
    scaling: float

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    def delta(self) -> torch.Tensor:
        """scaling * B @ A: [out_features, in_features], float32."""
        return (self.B @ self.A) * self.scaling


@dataclass(frozen=True)
class PeftAdapter:
    path: Path
    modules: tuple[LoraModule, ...]

    @property
    def rank(self) -> int:
        """The largest rank of the adapter's modules (what SGLang's --max-lora-rank must cover)."""
        return max(m.rank for m in self.modules)

    @property
    def target_modules(self) -> set[str]:
        """Short names of the adapted layers (q_proj, down_proj, ...), as SGLang's --lora-target-modules lists them."""
        return {m.weight.removesuffix(".weight").rsplit(".", 1)[-1] for m in self.modules}


def _pattern_value(patterns: dict, module: str, default):
    """peft's rank_pattern / alpha_pattern lookup: the first pattern matching the end of `module` at a dot."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _read_config(path: Path) -> dict:
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise AdapterError(f"{path / CONFIG_FILE} is not valid JSON ({e}); write it with peft's save_pretrained")
    if not isinstance(config, dict):
        raise AdapterError(f"{path / CONFIG_FILE} must hold a JSON object; write it with peft's save_pretrained")
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{path / CONFIG_FILE}: peft_type is {config.get('peft_type')!r}; only LoRA adapters "
                           f"(peft_type \"LORA\") are served")
    for key, neutral in _UNSUPPORTED.items():
        if config.get(key) not in neutral:
            raise AdapterError(f"{path / CONFIG_FILE}: {key}={config[key]!r} is not supported when serving LoRA "
                               f"adapters here (only {neutral[0]!r}); train the adapter without it")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AdapterError(f"{path / CONFIG_FILE}: r must be an integer >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise AdapterError(f"{path / CONFIG_FILE}: lora_alpha must be a number, got {alpha!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(key) or {}, dict):
            raise AdapterError(f"{path / CONFIG_FILE}: {key} must be an object (module pattern -> value)")
    return config


def _check_files(path: Path) -> None:
    if not path.is_dir():
        raise AdapterError(f"LoRA adapter path {path} is not a directory; pass the directory peft's "
                           f"save_pretrained wrote")
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (path / name).is_file()]
    if not missing:
        return
    if WEIGHTS_FILE in missing and (path / "adapter_model.bin").is_file():
        raise AdapterError(f"{path} holds adapter_model.bin; save the adapter with safe_serialization=True "
                           f"(peft's default) so it is {WEIGHTS_FILE}")
    nested = sorted(p.parent.name for p in path.glob(f"*/{CONFIG_FILE}"))
    hint = (f" (peft saves a non-default adapter in a subdirectory: pass {path / nested[0]})" if nested
            else "; pass the directory peft's save_pretrained wrote")
    raise AdapterError(f"LoRA adapter directory {path} has no {' or '.join(missing)}{hint}")


def read_peft_adapter(path: str | Path, model_weights: Mapping[str, torch.Tensor], *,
                      tied: frozenset[str] = frozenset()) -> PeftAdapter:
    """Read and check the adapter in `path` against a model's weights (its state dict, name -> tensor).

    `tied`: weight names shared with another weight (a tied lm_head), which an adapter may not target.
    Raises AdapterError (one line) for anything that cannot be served; see the module docstring.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    _check_files(path)
    config = _read_config(path)
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError) as e:
        raise AdapterError(f"{path / WEIGHTS_FILE} cannot be read ({e}); write it with peft's save_pretrained")
    factors: dict[str, dict[str, torch.Tensor]] = {}
    copies: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        copy = _BASE_COPY.match(key)
        if copy is not None:
            copies[f"{copy['module']}.weight"] = tensor
        elif match is None:
            raise AdapterError(f"{path / WEIGHTS_FILE}: key {key} is not a lora_A/lora_B weight of a linear layer "
                               f"(base_model.model.<module>.lora_A.weight); only LoRA on linear layers is served")
        else:
            factors.setdefault(match["module"], {})[match["part"]] = tensor
    if not factors:
        raise AdapterError(f"{path / WEIGHTS_FILE} holds no LoRA weights; was the adapter saved before training?")
    modules = []
    for module, parts in sorted(factors.items()):
        modules.append(_module(path, config, module, parts, model_weights, tied))
    for weight, tensor in copies.items():  # peft saved the base weight too: it must be this model's, unchanged
        own = model_weights.get(weight)
        if own is None or tuple(own.shape) != tuple(tensor.shape) or not torch.equal(own, tensor.to(own.dtype)):
            raise AdapterError(f"{path / WEIGHTS_FILE} holds a copy of {weight} that differs from this model's "
                               f"(a resized vocabulary, or another base model); serve it with the model it was "
                               f"trained on")
    return PeftAdapter(path=path, modules=tuple(modules))


def _module(path: Path, config: dict, module: str, parts: dict[str, torch.Tensor],
            model_weights: Mapping[str, torch.Tensor], tied: frozenset[str]) -> LoraModule:
    where = f"{path / WEIGHTS_FILE}: {module}"
    if set(parts) != {"A", "B"}:
        raise AdapterError(f"{where} has lora_{''.join(parts)} but not lora_{'B' if 'A' in parts else 'A'}; "
                           f"the adapter file is incomplete")
    weight = f"{module}.weight"
    if weight not in model_weights:
        raise AdapterError(f"{where} adapts a module this model does not have ({weight}); was the adapter trained "
                           f"on another model?")
    if weight in tied:
        raise AdapterError(f"{where}: {weight} is tied to another weight of this model, so merging an adapter into "
                           f"it would change both; leave it out of the adapter's target_modules")
    own = model_weights[weight]
    r = _pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"])
    A, B = parts["A"], parts["B"]
    if own.dim() != 2 or A.dim() != 2 or B.dim() != 2:
        raise AdapterError(f"{where}: lora_A {list(A.shape)}, lora_B {list(B.shape)} and the weight "
                           f"{list(own.shape)} must all be matrices")
    out_features, in_features = own.shape
    if tuple(A.shape) != (r, in_features) or tuple(B.shape) != (out_features, r):
        raise AdapterError(f"{where}: lora_A is {list(A.shape)} and lora_B {list(B.shape)}, but rank {r} on this "
                           f"model's {list(own.shape)} weight needs [{r}, {in_features}] and [{out_features}, {r}]; "
                           f"was the adapter trained on another model, or is adapter_config.json's r wrong?")
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return LoraModule(weight=weight, A=A.float(), B=B.float(), scaling=float(scaling))


def merged_weights(base: Mapping[str, torch.Tensor], adapter: PeftAdapter) -> dict[str, torch.Tensor]:
    """The weights `adapter` changes, merged: name -> base[name] + scaling * B @ A, in base[name]'s dtype and
    device. Weights the adapter does not touch are not in the result."""
    out = {}
    for m in adapter.modules:
        w = base[m.weight]
        out[m.weight] = (w.float() + m.delta().to(w.device)).to(w.dtype)
    return out


__all__ = ["AdapterError", "CONFIG_FILE", "LoraModule", "PeftAdapter", "WEIGHTS_FILE", "merged_weights",
           "read_peft_adapter"]
