"""Push the trainer's weights to the rollout engine(s) after every update.

- backend "local" (`LocalEngine`, same process as the driver): the unsharded state dict is handed over in
  memory (`engine.update_weights(state_dict)`); no disk.
- backend "sglang": the state dict is written once as an HF checkpoint (safetensors + the model's config and
  tokenizer files) under `run_dir/weights/step_NNNNNN/`, then `engine.update_weights(dir)` makes every server
  load it (`POST /update_weights_from_disk`; the router does not broadcast, the SGLangEngine calls each
  server). The servers must be able to read `run_dir` (shared filesystem on a cluster). Only the newest
  weights folder is kept.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

# Files an HF model directory needs besides the weights.
HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja", "added_tokens.json")


def write_hf_checkpoint(state_dict: dict[str, torch.Tensor], src_model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write `state_dict` as `out_dir/model.safetensors` next to copies of the source model's config and
    tokenizer files. Tied weights (lm_head sharing the embedding) are stored once, as HF does."""
    from safetensors.torch import save_file

    src, out = Path(src_model_dir), Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors, seen = {}, {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tensor.shape, tensor.dtype)
        if tensor.data_ptr() != 0 and key in seen:
            continue  # a tied alias of a tensor already written
        seen[key] = name
        tensors[name] = tensor.detach().contiguous().cpu()
    if "lm_head.weight" in tensors and "model.embed_tokens.weight" in tensors:
        import json

        cfg = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
        if cfg.get("tie_word_embeddings"):
            tensors.pop("lm_head.weight")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


async def sync_weights(state_dict: dict[str, torch.Tensor], engine, *, backend: str, model_path: str,
                       run_dir: str | Path, step: int) -> dict[str, float]:
    """Send `state_dict` (from `WorkerGroup.full_state_dict()`) to `engine`; returns timing metrics."""
    t0 = time.perf_counter()
    if backend == "local":
        await engine.update_weights(state_dict)
        return {"timing/weight_push_s": time.perf_counter() - t0}
    if backend == "sglang":
        root = Path(run_dir) / "weights"
        path = write_hf_checkpoint(state_dict, model_path, root / f"step_{step:06d}")
        t1 = time.perf_counter()
        await engine.update_weights(str(path.resolve()))
        for old in root.glob("step_*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        return {"timing/weight_write_s": t1 - t0, "timing/weight_push_s": time.perf_counter() - t1}
    raise ValueError(f"engine.backend {backend!r}: weight sync supports 'local' and 'sglang'")


__all__ = ["HF_SIDE_FILES", "sync_weights", "write_hf_checkpoint"]
