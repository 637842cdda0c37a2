"""Push the trainer's weights to the rollout engine(s) after every update.

- backend "local" (`LocalEngine`, same process as the driver): the unsharded state dict is handed over in
  memory (`engine.update_weights(state_dict)`); no disk. When the trainer's rank 0 runs on the driver's host
  it writes the weights into one shared-memory file (`SharedStateDict`, mapped by both processes), so a step's
  weights cross from the Ray worker to the driver as one memcpy instead of a pickled state dict through
  Ray's object store.
- backend "sglang": the state dict is written once as an HF checkpoint (safetensors + the model's config and
  tokenizer files) under `run_dir/weights/step_NNNNNN/`, then `engine.update_weights(dir)` makes every server
  load it (`POST /update_weights_from_disk`; the router does not broadcast, the SGLangEngine calls each
  server). The servers must be able to read `run_dir` (shared filesystem on a cluster). Only the newest
  weights folder is kept. With `engine.weight_sync: broadcast` (`broadcast_weights`) nothing touches the disk: the
  trainer's rank 0 broadcasts the tensors to every server over a process group (SGLang's
  `/update_weights_from_distributed`, `agentrl.inference.weight_broadcast`).
"""

from __future__ import annotations

import asyncio
import json
import math
import mmap
import os
import secrets
import shutil
import time
from pathlib import Path

import torch

from agentrl.errors import WeightSyncError, WeightSyncTimeoutError, one_line
from agentrl.files import make_readable
from agentrl.inference.base import EngineError
from agentrl.inference.weight_broadcast import BroadcastError

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
    cfg = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    tensors = {name: tensor.cpu() for name, tensor in hf_tensors(
        state_dict, tie_word_embeddings=bool(cfg.get("tie_word_embeddings")))}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    make_readable(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def hf_tensors(state_dict: dict[str, torch.Tensor], *, tie_word_embeddings: bool) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs an engine needs, as HF stores them: each shared tensor once, and no lm_head when
    it is tied to the embedding (the engine ties it on load)."""
    out = [(name, state_dict[name].detach().contiguous()) for name, alias in tied_aliases(state_dict).items()
           if alias is None]
    if tie_word_embeddings and "model.embed_tokens.weight" in state_dict:
        out = [(name, tensor) for name, tensor in out if name != "lm_head.weight"]
    return out


def tied_aliases(state_dict: dict[str, torch.Tensor]) -> dict[str, str | None]:
    """name -> the earlier name whose tensor it is (same storage, shape and dtype: lm_head tied to the
    embedding), or None for the first holder of each tensor."""
    first: dict[tuple, str] = {}
    out: dict[str, str | None] = {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        out[name] = first.get(key) if tensor.data_ptr() != 0 else None
        first.setdefault(key, name)
    return out


class SharedStateDict:
    """A state dict laid out in one shared-memory file: the trainer's rank 0 writes it (`write`), the driver maps
    it and reads views (`attach`, `views`). Tied tensors (lm_head sharing the embedding) are stored once.

    The writer creates the file under /dev/shm; the reader unlinks it as soon as it has mapped it, so the memory
    goes back to the system when both processes exit, however they exit. Layout: (name, byte offset, shape,
    dtype name, name of the tensor it aliases or None)."""

    ALIGN = 64
    DIR = "/dev/shm"
    HEADROOM = 64 << 20  # bytes left free in /dev/shm (Ray's object store lives there too)

    def __init__(self, path: str, layout: list[tuple], nbytes: int, mapping: mmap.mmap):
        self.path, self.layout, self.nbytes = path, layout, nbytes
        self._mmap = mapping
        self._views = self._make_views()

    @classmethod
    def available(cls) -> bool:
        return os.path.isdir(cls.DIR) and os.access(cls.DIR, os.W_OK)

    @classmethod
    def fits(cls, nbytes: int) -> bool:
        """Room for `nbytes` in /dev/shm: a file mapped past the filesystem's free space dies with SIGBUS on
        write (Docker gives containers a 64 MB /dev/shm by default)."""
        try:
            st = os.statvfs(cls.DIR)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= nbytes + cls.HEADROOM

    @classmethod
    def layout_size(cls, state_dict: dict[str, torch.Tensor]) -> int:
        return cls._layout(state_dict)[1]

    @classmethod
    def create(cls, state_dict: dict[str, torch.Tensor]) -> SharedStateDict:
        layout, offset = cls._layout(state_dict)
        path = os.path.join(cls.DIR, f"agentrl-weights-{os.getpid()}-{secrets.token_hex(6)}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, max(offset, 1))
            mapping = mmap.mmap(fd, max(offset, 1))
        finally:
            os.close(fd)
        return cls(path, layout, max(offset, 1), mapping)

    @classmethod
    def _layout(cls, state_dict: dict[str, torch.Tensor]) -> tuple[list[tuple], int]:
        layout, offsets, offset = [], {}, 0
        for name, alias in tied_aliases(state_dict).items():
            tensor = state_dict[name]
            if alias is None:
                offset = offsets[name] = -(-offset // cls.ALIGN) * cls.ALIGN
                offset += tensor.numel() * tensor.element_size()
            layout.append((name, offsets[alias or name], tuple(tensor.shape), str(tensor.dtype), alias))
        return layout, offset

    @classmethod
    def attach(cls, path: str, layout: list[tuple], nbytes: int) -> SharedStateDict:
        fd = os.open(path, os.O_RDWR)
        try:
            mapping = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        os.unlink(path)  # both sides hold the mapping now; the name is no longer needed
        return cls(path, layout, nbytes, mapping)

    def _make_views(self) -> dict[str, torch.Tensor]:
        buffer = torch.frombuffer(self._mmap, dtype=torch.uint8)
        views = {}
        for name, offset, shape, dtype_name, alias in self.layout:
            if alias is not None:
                views[name] = views[alias]
                continue
            dtype = getattr(torch, dtype_name.removeprefix("torch."))
            views[name] = buffer[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
        return views

    def matches(self, state_dict: dict[str, torch.Tensor]) -> bool:
        return list(state_dict) == [entry[0] for entry in self.layout] and all(
            tuple(t.shape) == entry[2] and str(t.dtype) == entry[3] for t, entry in zip(state_dict.values(),
                                                                                         self.layout))

    def write(self, state_dict: dict[str, torch.Tensor]) -> None:
        for name, _, _, _, alias in self.layout:
            if alias is None:
                self._views[name].copy_(state_dict[name])

    def views(self) -> dict[str, torch.Tensor]:
        """name -> tensor backed by the shared file (read them before the next `write`)."""
        return dict(self._views)

    def handle(self) -> tuple[str, list[tuple], int]:
        return self.path, self.layout, self.nbytes

    def close(self) -> None:
        self._views = {}
        try:
            self._mmap.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
        if os.path.exists(self.path) and self.path.startswith(self.DIR):
            try:
                os.unlink(self.path)
            except OSError:
                pass


async def sync_weights(state_dict: dict[str, torch.Tensor], engine, *, backend: str, model_path: str,
                       run_dir: str | Path, step: int, on_running: str | None = None) -> dict[str, float]:
    """Send `state_dict` (from `WorkerGroup.full_state_dict()`) to `engine` as weight version `step` (the step
    whose update made them: tokens sampled with them record it); returns timing metrics. `on_running` (async
    mode; None: the engine is idle): what happens to requests in flight, "continue" (they go on under the new
    weights; SGLang servers are paused in place around the load) or "abort" (they end with finish_reason
    "abort")."""
    t0 = time.perf_counter()
    if backend == "local":
        options = {} if on_running is None else {"on_running": on_running}
        await engine.update_weights(state_dict, version=step, **options)
        return {"timing/weight_push_s": time.perf_counter() - t0}
    if backend == "sglang":
        root = Path(run_dir) / "weights"
        path = write_hf_checkpoint(state_dict, model_path, root / f"step_{step:06d}")
        t1 = time.perf_counter()
        if on_running == "continue":
            await engine.pause_generation("in_place")
        try:
            abort = {"abort_in_flight": True} if on_running == "abort" else {}
            await engine.update_weights(str(path.resolve()), version=step, **abort)
        finally:
            if on_running == "continue":
                await engine.continue_generation()
        for old in root.glob("step_*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        return {"timing/weight_write_s": t1 - t0, "timing/weight_push_s": time.perf_counter() - t1}
    raise ValueError(f"engine.backend {backend!r}: weight sync supports 'local' and 'sglang'")


async def broadcast_weights(workers, engine, *, step: int, token_file: str | None, bucket_mb: float,
                            timeout_s: float, flatten: bool = False, on_running: str | None = None) -> dict[str, float]:
    """Send the policy's weights from the trainer's rank 0 straight to every SGLang-protocol server of `engine`
    (an `SGLangEngine`) over a process group, as weight version `step` (`WorkerGroup.broadcast_weights`); no disk.
    `on_running` as in `sync_weights`."""
    t0 = time.perf_counter()
    if on_running == "continue":
        await engine.pause_generation("in_place")
    try:
        abort = on_running == "abort"
        async with engine.weight_update(version=step, abort_in_flight=abort) as label:
            target = {"urls": list(engine.urls), "token_file": token_file, "bucket_mb": bucket_mb,
                      "flatten": flatten, "timeout_s": timeout_s, "weight_version": label, "abort_all_requests": abort}
            metrics = await asyncio.to_thread(workers.broadcast_weights, target)
    finally:
        if on_running == "continue":
            await engine.continue_generation()
    return {**metrics, "timing/weight_push_s": time.perf_counter() - t0}


async def sync_adapter(workers, engine, *, run_dir: str | Path, step: int,
                       on_running: str | None = None) -> dict[str, float]:
    """`engine.lora_sync: adapter`: rank 0 writes the policy's LoRA adapter (peft's format) under
    `run_dir`/weights/adapter_step_N (where the disk sync writes, so servers locked to `--weights-dir
    RUN_DIR/weights` read it) and every SGLang server loads it as weight version `step`
    (`lora_sync.push_adapter`); only the adapter crosses. The servers must read `run_dir` (one host, or a shared
    filesystem). `on_running` as in `sync_weights`."""
    from agentrl.trainer.lora_sync import push_adapter

    t0 = time.perf_counter()
    root = Path(run_dir) / "weights"
    path = await asyncio.to_thread(workers.save_adapter, root / f"adapter_step_{step:06d}")
    written = time.perf_counter() - t0
    metrics = await push_adapter(engine, path, version=step, on_running=on_running)
    for old in root.glob("adapter_step_*"):  # the servers unloaded the previous adapter: only this one is read
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return {**metrics, "timing/weight_write_s": written}


async def push_weights(workers, engine, cfg, step: int, *, during_rollout: bool = False, merged: bool = False) -> dict:
    """The policy to the engine as version `step` (`cfg`: the TrainConfig), within `trainer.weight_sync_timeout_s`
    (else WeightSyncTimeoutError): its LoRA adapter alone with `engine.lora_sync: adapter` (`sync_adapter`)
    unless `merged`, else the weights (merged when LoRA trains) by `broadcast_weights` or `sync_weights`.
    `during_rollout` (async mode): episodes are in flight and go on as `rollout.on_weight_update` says, instead of
    the engine being idle."""
    on_running = cfg.rollout.on_weight_update if during_rollout else None
    timeout_s = cfg.trainer.weight_sync_timeout_s
    if cfg.engine.backend == "sglang" and cfg.actor.lora is not None and cfg.engine.lora_sync == "adapter" \
            and not merged:
        sync = sync_adapter(workers, engine, run_dir=cfg.trainer.run_dir, step=step, on_running=on_running)
    elif cfg.engine.backend == "sglang" and cfg.engine.weight_sync == "broadcast":
        sync = broadcast_weights(workers, engine, step=step, token_file=cfg.engine.token_file,
                                 bucket_mb=cfg.engine.weight_bucket_mb, flatten=cfg.engine.weight_flatten_buckets,
                                 timeout_s=timeout_s, on_running=on_running)
    else:
        # shared-memory views when rank 0 runs on this host (the local engine loads them, the disk sync writes them)
        weights = await asyncio.to_thread(workers.engine_state_dict)
        sync = sync_weights(weights, engine, backend=cfg.engine.backend, model_path=cfg.model.path,
                            run_dir=cfg.trainer.run_dir, step=step, on_running=on_running)
    try:
        return await asyncio.wait_for(sync, timeout_s)
    except (EngineError, BroadcastError) as e:
        raise WeightSyncError(
            f"pushing step {step}'s weights to the engine (engine.backend {cfg.engine.backend}, weight_sync "
            f"{cfg.engine.weight_sync}) failed: {one_line(e)}; the step's update is saved, rerunning the command "
            "resumes after it once the engine is back") from e
    except TimeoutError as e:
        raise WeightSyncTimeoutError(
            f"pushing step {step}'s weights to the engine (engine.backend {cfg.engine.backend}) took longer than "
            f"trainer.weight_sync_timeout_s={cfg.trainer.weight_sync_timeout_s:g}: check that the engine is up and "
            "not stuck (its log), or raise the timeout for a large model; the step's update is saved, rerunning "
            "the command resumes after it") from e


async def foreign_weight_labels(engine, cfg) -> list[str]:
    """At a fresh start: the labels of SGLang servers that serve weights pushed before this run (an earlier run's
    last step; anything but the "default" weights they started with), which the run's initial weights must replace
    before step 1 samples; [] when every server serves its own. Other backends start with this run's weights."""
    if cfg.engine.backend != "sglang":
        return []
    return sorted({label for label in await engine.weight_labels() if label != "default"})


__all__ = ["HF_SIDE_FILES", "SharedStateDict", "broadcast_weights", "foreign_weight_labels", "hf_tensors",
           "push_weights", "sync_adapter", "sync_weights", "write_hf_checkpoint"]
