"""Push the LoRA adapter the trainer just wrote to every SGLang server (`engine.lora_sync: adapter`).

Per step: load the adapter directory on every server under a name of its own, `policy-v{version}` (SGLang refuses
to load a name that is loaded, and a request in flight keeps the adapter it named until it finishes); switch the
client's requests to it (`SGLangEngine.set_lora_adapter`: every /generate names it in `lora_path` and its tokens
record `version`); then unload the adapter before it. Only the adapter crosses, a few MB instead of the model.

The directory must be readable by every server (a shared filesystem on a cluster; under `--weights-dir` for
`agentrl engine serve`). The servers must be launched for LoRA: `agentrl engine launch-sglang --lora-rank R
--lora-target-modules ...` or `agentrl engine serve --enable-lora`. Adapters an earlier run left loaded are not
tracked here; the servers' `--max-loaded-loras 2` unloads them as the new ones arrive (least recently used first).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from agentrl.errors import WeightSyncError, one_line
from agentrl.inference.base import EngineError

ADAPTER_PREFIX = "policy-v"


def adapter_name(version: int) -> str:
    """The name the adapter of weight version `version` is loaded under on every server."""
    return f"{ADAPTER_PREFIX}{version}"


async def push_adapter(engine, adapter_dir: str | Path, *, version: int,
                       on_running: str | None = None) -> dict[str, float]:
    """Serve the peft adapter in `adapter_dir` (adapter_config.json + adapter_model.safetensors, as peft's
    save_pretrained writes them) from every server of `engine` (an `SGLangEngine`) as weight version `version`
    (the step whose update made it); returns timing metrics.

    `on_running` (as in `weight_sync.sync_weights`): None, the engine is idle; "continue", requests in flight are
    paused and go on under the new adapter from their tokens so far (each token keeps the version that sampled it);
    "abort", they end with finish_reason "abort" (`metrics["aborted_by"] = "weight_update"`).
    Raises WeightSyncError (one line naming the servers that failed); when the load fails the requests keep the
    adapter they had.
    """
    if on_running not in (None, "continue", "abort"):
        raise ValueError(f"on_running must be None, 'continue' or 'abort', got {on_running!r}")
    t0 = time.perf_counter()
    name = adapter_name(version)
    path = str(Path(adapter_dir).resolve())
    previous = engine.lora_adapter
    if name == previous:
        raise ValueError(f"LoRA adapter {name} is the one the engine serves; push each update as a new version")
    try:
        # a copy left by an earlier attempt at this version (a resumed run) is replaced, not refused as loaded
        await engine.unload_lora_adapter(name, missing_ok=True)
        await engine.load_lora_adapter(name, path)
    except EngineError as e:
        with contextlib.suppress(EngineError):  # servers that did load it drop it again: the push did not happen
            await engine.unload_lora_adapter(name, missing_ok=True)
        raise WeightSyncError(f"loading LoRA adapter {name} from {path} on the engine failed: {one_line(e)}; the "
                              f"servers keep serving {previous or 'the base weights'}") from e
    t1 = time.perf_counter()
    try:
        await _switch(engine, name, version, on_running)
    except EngineError as e:
        raise WeightSyncError(f"switching the engine's requests to LoRA adapter {name} failed: {one_line(e)}") from e
    if previous is not None:
        try:
            await engine.unload_lora_adapter(previous, missing_ok=True)
        except EngineError as e:
            raise WeightSyncError(f"unloading the previous LoRA adapter {previous} failed: {one_line(e)}; requests "
                                  f"already use {name}") from e
    return {"timing/lora_load_s": t1 - t0, "timing/weight_push_s": time.perf_counter() - t0}


async def _switch(engine, name: str, version: int, on_running: str | None) -> None:
    """Make `name` the adapter of every request from now on, and deal with the requests in flight."""
    if on_running == "abort":
        async with engine.weight_update(version=version, abort_in_flight=True):
            engine.set_lora_adapter(name, version)
            await engine.abort_all()
        return
    if on_running == "continue":
        # "abort" pauses hand each request back with its tokens so far; the client sends the rest after
        # continue_generation, naming the new adapter, so none is left on the adapter unloaded next
        await engine.pause_generation("abort")
    try:
        engine.set_lora_adapter(name, version)
    finally:
        if on_running == "continue":
            await engine.continue_generation()


__all__ = ["ADAPTER_PREFIX", "adapter_name", "push_adapter"]
