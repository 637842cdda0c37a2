"""`agentrl export CHECKPOINT_DIR OUT_DIR`: a sharded trainer checkpoint -> a Hugging Face model directory (a
LoRA run's checkpoint: its adapter in peft's format, or with `--merged` the model with the adapter merged in).

    agentrl export runs/calc-tiny-cpu/checkpoints/step_000010 runs/calc-step10
    agentrl export runs/calc-lora/checkpoints/step_000010 runs/calc-lora-adapter            # actor.lora runs
    agentrl export runs/calc-lora/checkpoints/step_000010 runs/calc-lora-merged --merged
    agentrl eval --model runs/calc-tiny-cpu/checkpoints/step_000010 --suite calc    # exports on the fly

A checkpoint's `actor/` holds the weights and the optimizer state, sharded by torch.distributed.checkpoint (one
file per rank that wrote it). Export reads only the weights, in one process, whatever the number of ranks; the
checkpoint's `hf_config/` supplies config.json and the tokenizer. The result loads with
`AutoModelForCausalLM.from_pretrained(OUT_DIR)` and `AutoTokenizer.from_pretrained(OUT_DIR)`, like the
`final_model/` a run writes at its end.

A checkpoint of a run with `actor.lora` holds the adapters only. Export writes them as `PeftModel.save_pretrained`
does (`adapter_config.json`, `adapter_model.safetensors`, plus the tokenizer files): load them with
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), OUT_DIR)` or serve them with SGLang's LoRA
routes. `--merged` instead writes W + (alpha / rank) * B @ A into the base model's weights (peft's
`merge_and_unload`): a plain HF model directory. Both read the frozen weights from the `model.path` in the
checkpoint's config.yaml, which must still exist for `--merged`.

`resolve_model_dir(path)` lets whatever takes a model directory take a checkpoint too: the checkpoint is exported
(merged, for a LoRA checkpoint) once into `<checkpoint>/hf/` (a temporary directory when the checkpoint is
read-only) and that path is returned.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

# torch (imported by agentrl.trainer.checkpoint) loads inside the functions: `agentrl --help` imports this module.

CACHE_DIR = "hf"  # resolve_model_dir's export inside a checkpoint


def check_checkpoint(path: str | Path) -> Path:
    """`path` as a complete trainer checkpoint directory, or a CheckpointError saying what it is instead."""
    from agentrl.trainer.checkpoint import (
        MARKER,
        SHARDS_DIR,
        CheckpointError,
        checkpoints_root,
        latest_checkpoint,
        marker_step,
    )

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist; checkpoints are the "
                              "RUN_DIR/checkpoints/step_NNNNNN folders a run writes every trainer.save_freq steps")
    if checkpoints_root(path).is_dir():
        latest = latest_checkpoint(path)
        example = latest if latest is not None else checkpoints_root(path) / "step_NNNNNN"
        raise CheckpointError(f"{path} is a run directory, not a checkpoint; pass one of its checkpoints, "
                              f"e.g. {example}")
    if marker_step(path) is None:
        if not (path / SHARDS_DIR).is_dir() and not path.name.startswith("step_"):
            raise CheckpointError(f"{path} is not a trainer checkpoint (no {SHARDS_DIR}/ with sharded weights, no "
                                  f"{MARKER} file); pass a RUN_DIR/checkpoints/step_NNNNNN folder")
        latest = latest_checkpoint(path.parent.parent)
        hint = f"; the latest complete one is {latest}" if latest is not None else ""
        raise CheckpointError(f"checkpoint {path} is incomplete: it has no {MARKER} file (the run stopped while "
                              f"writing it){hint}")
    if not (path / SHARDS_DIR / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: {path / SHARDS_DIR / '.metadata'} is missing, so its "
                              "sharded weights cannot be read; use another checkpoint of the run")
    return path


def hf_files_dir(checkpoint: Path) -> Path:
    """Where the checkpoint's model config and tokenizer files are: its hf_config/, else the model.path of the
    config it was saved with (when that directory still exists)."""
    from agentrl.trainer.checkpoint import CONFIG_FILE, HF_FILES_DIR, CheckpointError

    own = checkpoint / HF_FILES_DIR
    if (own / "config.json").is_file():
        return own
    saved = checkpoint / CONFIG_FILE
    if saved.is_file():
        import yaml

        model_path = Path(yaml.safe_load(saved.read_text())["model"]["path"])
        if (model_path / "config.json").is_file():
            return model_path
    raise CheckpointError(f"checkpoint {checkpoint} has no {HF_FILES_DIR}/config.json and the model.path in its "
                          f"{CONFIG_FILE} holds no config.json; copy the model's config.json and tokenizer files "
                          f"into {own}")


def load_weights(checkpoint: Path, shards_dir: str | None = None) -> dict:
    """The full (unsharded) model state dict {name: tensor} of a checkpoint, read in this process; the optimizer
    state beside it is not read. `shards_dir`: the model's folder in the checkpoint (default the policy's
    `actor/`; the critic's is `critic/`)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from agentrl.trainer.checkpoint import SHARDS_DIR, CheckpointError

    shards = checkpoint / (shards_dir or SHARDS_DIR)
    metadata = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    weights = {key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
               for key, meta in metadata.items()
               if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    if not weights:
        raise CheckpointError(f"checkpoint {checkpoint}: {shards} holds no model weights")
    state = {"model": weights}
    with warnings.catch_warnings():  # reading in one process is the point here, not a mistake to warn about
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(shards)), no_dist=True)
    return state["model"]


def checkpoint_lora(checkpoint: Path):
    """(actor.lora, model.path) of the run that wrote `checkpoint`, from its config.yaml; (None, None) for a
    full-model checkpoint."""
    import yaml

    from agentrl.trainer.checkpoint import CONFIG_FILE
    from agentrl.trainer.config import LoraConfig

    saved = checkpoint / CONFIG_FILE
    tree = yaml.safe_load(saved.read_text()) if saved.is_file() else {}
    lora = (tree.get("actor") or {}).get("lora")
    return (LoraConfig(**lora), tree["model"]["path"]) if lora else (None, None)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, *, merged: bool = False) -> Path:
    """Write the checkpoint's weights, config and tokenizer as an HF model directory `out_dir` (which must not
    exist yet, or be empty); returns it. A LoRA checkpoint gives its adapter in peft's format, or with `merged` the
    base model with the adapter merged in; `merged` changes nothing for a full-model checkpoint."""
    from agentrl.trainer.checkpoint import CheckpointError
    from agentrl.trainer.weight_sync import write_hf_checkpoint

    checkpoint, out = check_checkpoint(checkpoint), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"export output {out} already exists and is not empty; pass a new directory")
    if out.exists():
        out.rmdir()
    weights = load_weights(checkpoint)
    lora, base = checkpoint_lora(checkpoint)
    if lora is None and any(".lora_A." in name for name in weights):
        raise CheckpointError(f"checkpoint {checkpoint} holds LoRA adapters but no {checkpoint.name}/config.yaml "
                              "with their actor.lora (rank, alpha): copy the run's config.yaml into it")
    if lora is None:
        return write_hf_checkpoint(weights, hf_files_dir(checkpoint), out)
    from agentrl.trainer.lora import merge_adapter, write_adapter

    if not merged:
        return write_adapter(weights, lora, base, out, side_files=hf_files_dir(checkpoint))
    if not (Path(base) / "config.json").is_file():
        raise CheckpointError(f"checkpoint {checkpoint} holds LoRA adapters of the model at {base}, which is not "
                              "there any more: --merged needs those base weights; export without --merged for the "
                              "adapter, or restore the base model at that path")
    return write_hf_checkpoint(merge_adapter(base, weights, lora), hf_files_dir(checkpoint), out)


def is_checkpoint_dir(path: str | Path) -> bool:
    """True for what looks like a trainer checkpoint (complete or not): a step_NNNNNN folder or one with actor/."""
    from agentrl.trainer.checkpoint import SHARDS_DIR

    path = Path(path)
    return path.is_dir() and (path.name.startswith("step_") or (path / SHARDS_DIR).is_dir())


def resolve_model_dir(path: str | Path) -> Path:
    """An HF model directory for `path`: `path` itself when it has a config.json, else `path` as a checkpoint,
    exported once into `<path>/hf/` (or a temporary directory when the checkpoint is read-only)."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    checkpoint = check_checkpoint(path)
    cached = checkpoint / CACHE_DIR
    if (cached / "config.json").is_file():
        return cached
    try:
        out = export_checkpoint(checkpoint, cached, merged=True)
    except PermissionError:
        out = export_checkpoint(checkpoint, Path(tempfile.mkdtemp(prefix="agentrl-export-")) / checkpoint.name,
                                merged=True)
    print(f"exported checkpoint {checkpoint} to the model directory {out}", file=sys.stderr, flush=True)
    return out


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="turn a sharded training checkpoint into an HF model directory",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a RUN_DIR/checkpoints/step_NNNNNN folder")
    p.add_argument("out", metavar="OUT_DIR", help="the model directory to write (new or empty)")
    p.add_argument("--merged", action="store_true",
                   help="a LoRA checkpoint: write the base model with the adapter merged in, not the adapter")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from agentrl.trainer.checkpoint import SHARDS_DIR, marker_step

    out = export_checkpoint(args.checkpoint, args.out, merged=args.merged)
    shards = len(list((Path(args.checkpoint) / SHARDS_DIR).glob("*.distcp")))
    what = f"exported step {marker_step(Path(args.checkpoint))} of {args.checkpoint} ({shards} shard files)"
    lora, base = checkpoint_lora(Path(args.checkpoint))
    if lora is not None and not args.merged:
        print(f"{what}: its LoRA adapter to {out}; load it with PeftModel.from_pretrained(AutoModelForCausalLM."
              f"from_pretrained({base!r}), {str(out)!r}), or export with --merged for a plain model")
    else:
        print(f"{what} to {out}; load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


__all__ = ["check_checkpoint", "checkpoint_lora", "export_checkpoint", "hf_files_dir", "is_checkpoint_dir",
           "load_weights", "resolve_model_dir"]
