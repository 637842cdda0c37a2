"""LoRA on the FSDP2 policy (`actor.lora`): peft adapters, the reference as the adapters switched off, adapter-only
checkpoints, merged weights for the engines and the adapter in peft's on-disk format.

    model = wrap(hf_model, cfg.lora)               # before fully_shard: a peft PeftModel, only the adapters train
    with adapters_off(model): ...                  # the base model: the reference policy, no second copy
    merged = merged_state_dict(gathered, cfg.lora) # base parameter names, W + (alpha / rank) * B @ A
    write_adapter(model, gathered, path)           # adapter_config.json + adapter_model.safetensors

Parameter names. The policy is a `peft.PeftModel`, so its state dict reads
`base_model.model.<hf name>` for untouched weights, `base_model.model.<layer>.base_layer.weight` for an adapted
layer's frozen W and `base_model.model.<layer>.lora_A.default.weight` ([rank, in]) / `lora_B` ([out, rank]) for
its adapter. The engines get the HF names (`<layer>.weight`) with the adapter merged in, so LocalEngine, the disk
sync and the broadcast load them as they load a fully fine-tuned policy. A checkpoint's `actor/` holds the
adapters and their AdamW moments only: the frozen weights come back from `model.path`.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

from agentrl.errors import UserError
from agentrl.trainer.config import LoraConfig

ADAPTER = "default"  # peft's adapter name; it is not part of the on-disk names
PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG_FILE = "adapter_config.json"  # the files PeftModel.save_pretrained writes
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


class LoraTargetError(UserError, ValueError):
    """actor.lora.target_modules names no linear layer of the model."""


def peft_config(lora: LoraConfig, base_model_path: str | None = None):
    """The `peft.LoraConfig` of `actor.lora` (plain LoRA: no bias, no rsLoRA, B initialised to zero)."""
    import peft

    return peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=lora.module_names(), bias="none", task_type="CAUSAL_LM",
                           base_model_name_or_path=base_model_path)


def scaling(lora: LoraConfig) -> float:
    """The factor of B @ A in every adapted layer: alpha / rank."""
    return lora.alpha / lora.rank


def wrap(model: torch.nn.Module, lora: LoraConfig, model_path: str):
    """`model` (an HF causal LM, not sharded yet) with adapters on `lora.target_modules`; every other weight frozen.
    A is drawn from torch's generator, so ranks seeded alike start from the same adapters."""
    import peft

    present = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    missing = [name for name in lora.module_names() if name not in present]
    if missing:
        raise LoraTargetError(f"actor.lora.target_modules {missing} name no linear layer of {model_path} (its linear "
                              f"layers: {', '.join(sorted(present))}); drop them from the list")
    with warnings.catch_warnings():  # peft asks transformers a deprecated name; nothing for the user to do
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return peft.get_peft_model(model, peft_config(lora, model_path))


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def hf_model(model):
    """The HF causal LM inside a PeftModel (the model itself otherwise): its config, forward signature, layers."""
    return model.get_base_model() if is_peft(model) else model


def adapters_off(model):
    """Context in which `model` (a PeftModel) computes the base model: the reference policy."""
    return model.disable_adapter()


def trainable_names(model) -> set[str]:
    """State-dict names of the parameters that train (the adapters under LoRA)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def merged_state_dict(state_dict: dict[str, torch.Tensor], lora: LoraConfig) -> dict[str, torch.Tensor]:
    """The full weights under the base model's names, each adapted layer's W replaced by W + (alpha / rank) * B @ A
    (computed in float32, cast to W's dtype; as peft's merge); `state_dict` is the PeftModel's unsharded state dict
    and is not changed. Other tensors are passed through (tied ones stay the same tensor)."""
    scale = scaling(lora)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        base = name.removeprefix(PEFT_PREFIX)
        if ".base_layer." in base:
            layer, param = base.split(".base_layer.")
            base = f"{layer}.{param}"
            if param == "weight":
                a = state_dict[f"{PEFT_PREFIX}{layer}.lora_A.{ADAPTER}.weight"].float()
                b = state_dict[f"{PEFT_PREFIX}{layer}.lora_B.{ADAPTER}.weight"].float()
                tensor = (tensor.float() + (b @ a) * scale).to(tensor.dtype)
        out[base] = tensor
    return out


def adapter_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter weights under peft's on-disk names (`...q_proj.lora_A.weight`: the adapter name dropped)."""
    return {name.replace(f".{ADAPTER}.", "."): tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()
            if ".lora_A." in name or ".lora_B." in name}


def write_adapter(state_dict: dict[str, torch.Tensor], lora: LoraConfig, base_model_path: str,
                  out_dir: str | Path, *, side_files: str | Path | None = None) -> Path:
    """Write the adapter in `state_dict` (a PeftModel's unsharded state dict, or only its adapter entries) as
    `PeftModel.save_pretrained` does: `adapter_config.json` and `adapter_model.safetensors` in `out_dir`, plus the
    tokenizer files of the model directory `side_files` when given. It loads with
    `PeftModel.from_pretrained(base, out_dir)`, and SGLang's `/load_lora_adapter` takes the directory."""
    from safetensors.torch import save_file

    from agentrl.files import make_readable
    from agentrl.trainer.weight_sync import HF_SIDE_FILES

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config(lora, str(base_model_path))
    config.inference_mode = True
    config.save_pretrained(str(out))
    save_file(adapter_tensors(state_dict), str(out / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    for name in HF_SIDE_FILES if side_files is not None else ():
        # not config.json: transformers would take the directory for a model and ignore the adapter
        if name not in ("config.json", "generation_config.json") and (Path(side_files) / name).is_file():
            shutil.copy2(Path(side_files) / name, out / name)
    make_readable(out)
    return out


def merge_adapter(base_model_path: str | Path, adapters: dict[str, torch.Tensor],
                  lora: LoraConfig) -> dict[str, torch.Tensor]:
    """The HF state dict of the model at `base_model_path` with the adapter weights `adapters` (PeftModel state-dict
    names) merged in by peft itself (`merge_and_unload`), in this process."""
    from transformers import AutoModelForCausalLM

    model = wrap(AutoModelForCausalLM.from_pretrained(base_model_path), lora, str(base_model_path))
    missing, unexpected = model.load_state_dict(adapters, strict=False)
    not_loaded = [name for name in missing if ".lora_" in name]
    if unexpected or not_loaded:
        raise ValueError(f"the adapter weights do not fit actor.lora on {base_model_path}: unexpected "
                         f"{unexpected[:3]}, missing {not_loaded[:3]}")
    return model.merge_and_unload().state_dict()


__all__ = ["ADAPTER_CONFIG_FILE", "ADAPTER_WEIGHTS_FILE", "LoraTargetError", "adapter_tensors", "adapters_off",
           "hf_model", "is_peft", "merge_adapter", "merged_state_dict", "peft_config", "scaling",
           "trainable_names", "wrap", "write_adapter"]
