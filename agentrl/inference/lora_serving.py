"""The LoRA adapters `agentrl engine serve --enable-lora` holds: SGLang's `/load_lora_adapter`,
`/unload_lora_adapter` and `/generate`'s `lora_path` on the CPU engine.

How: each loaded adapter gets a LocalEngine of its own over a copy of the base model with the adapter merged in
(`lora_adapters.merged_weights`, what peft's merge_and_unload gives); a request naming the adapter decodes there,
a request without `lora_path` on the base engine. Each adapter costs one copy of the model's weights and a decode
thread, so `--max-loaded-loras` (default 2: the adapter in use and the next one) bounds them.

Semantics follow SGLang 0.5.23 (srt/lora/lora_registry.py, srt/managers/tokenizer_control_mixin.py):
- loading a name that is loaded fails ("already loaded"): load the new weights under a new name, or unload first;
- a request naming an adapter that is not loaded is refused (HTTP 400) naming it;
- unloading stops new requests from naming the adapter at once, then waits for its requests in flight;
- past --max-loaded-loras the least recently used adapter that is not pinned is unloaded, as SGLang does;
- --max-lora-rank and --lora-target-modules, when given, refuse the adapters SGLang launched with them refuses.
Differences: SGLang batches requests for different adapters and the base together over one copy of the weights;
here each adapter decodes in its own batch. When the base weights change (/update_weights_from_disk, a
broadcast) every loaded adapter is merged again onto the new base (`rebase`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import torch

from agentrl.inference.local import LocalEngine
from agentrl.inference.lora_adapters import AdapterError, PeftAdapter, merged_weights, read_peft_adapter
from agentrl.inference.wire import WireError


@dataclass(eq=False)
class _Loaded:
    name: str
    path: str
    adapter: PeftAdapter
    engine: LocalEngine
    pinned: bool
    seq: int  # load order: the newest adapter's name is the server's weight_version
    in_flight: int = 0


def tied_weights(weights: dict[str, torch.Tensor]) -> frozenset[str]:
    """Names of weights that share their storage with another (a tied lm_head and the embeddings)."""
    holders = Counter(t.data_ptr() for t in weights.values())
    return frozenset(name for name, t in weights.items() if holders[t.data_ptr()] > 1)


class LoraAdapters:
    """Loaded adapters by name, least recently used first; call `load`/`unload`/`rebase` under the server's weight
    update lock, from its event loop."""

    def __init__(self, base: LocalEngine, *, max_loaded: int = 2, max_rank: int | None = None,
                 target_modules: set[str] | None = None, order: Iterator[int] | None = None):
        """`order` numbers every load (the server shares it with its base weight updates, so it can tell which
        weights are newest); None: a counter of this object's own."""
        if max_loaded < 1:
            raise ValueError(f"--max-loaded-loras must be >= 1, got {max_loaded}")
        self.base = base
        self.max_loaded = max_loaded
        self.max_rank = max_rank
        self.target_modules = target_modules  # None or {"all"}: any module
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        self._draining: list[_Loaded] = []  # unloaded, finishing their requests in flight
        self._changed = asyncio.Condition()
        self._order = order if order is not None else itertools.count(1)

    def loaded(self) -> dict[str, str]:
        """name -> path of every loaded adapter (SGLang's `loaded_adapters`)."""
        return {name: entry.path for name, entry in self._loaded.items()}

    def newest(self) -> tuple[int, str] | None:
        """(load number, name) of the adapter loaded last of those still loaded."""
        return max((e.seq, e.name) for e in self._loaded.values()) if self._loaded else None

    def engines(self) -> list[LocalEngine]:
        """Every adapter's engine, the unloaded ones still finishing requests too (pause, abort reach them)."""
        return [e.engine for e in [*self._loaded.values(), *self._draining]]

    def check(self, name: str) -> None:
        if name not in self._loaded:
            raise WireError(f"LoRA adapter {name!r} (lora_path) is not loaded on this server (loaded: "
                            f"{sorted(self._loaded)}): POST /load_lora_adapter {{\"lora_name\": \"{name}\", "
                            f"\"lora_path\": DIR}} first, or leave lora_path out to sample from the base weights")

    @contextlib.asynccontextmanager
    async def serving(self, name: str) -> AsyncIterator[LocalEngine]:
        """The engine of adapter `name` for one request; an unload waits until the request is done."""
        self.check(name)
        entry = self._loaded[name]
        self._loaded.move_to_end(name)
        entry.in_flight += 1
        try:
            yield entry.engine
        finally:
            entry.in_flight -= 1
            async with self._changed:
                self._changed.notify_all()

    async def load(self, name: str, path: str, *, pinned: bool = False) -> list[str]:
        """Load the peft adapter in `path` as `name`; returns the names unloaded to stay within max_loaded.
        Raises AdapterError (one line) and keeps what was loaded before."""
        if name in self._loaded:
            raise AdapterError(f"Failed to load LoRA adapter {name} because it is already loaded; load the new "
                               f"weights under a new name, or /unload_lora_adapter {name} first")
        entry = await asyncio.to_thread(self._build, name, path, pinned)
        self._loaded[name] = entry
        evicted = []
        while len(self._loaded) > self.max_loaded:
            victim = next((n for n, e in self._loaded.items() if not e.pinned and n != name), None)
            if victim is None:
                await self.unload(name)
                raise AdapterError(f"cannot load LoRA adapter {name}: the {self.max_loaded} loaded adapters "
                                   f"(--max-loaded-loras) are pinned; unload one first")
            await self.unload(victim)
            evicted.append(victim)
        return evicted

    def _build(self, name: str, path: str, pinned: bool) -> _Loaded:
        base = self.base.model.state_dict()
        adapter = read_peft_adapter(path, base, tied=tied_weights(base))
        if self.max_rank is not None and adapter.rank > self.max_rank:
            raise AdapterError(f"LoRA adapter {name} has rank {adapter.rank}, above this server's --max-lora-rank "
                               f"{self.max_rank}; restart the server with --max-lora-rank {adapter.rank} or more")
        extra = adapter.target_modules - (self.target_modules or {"all"})
        if self.target_modules is not None and "all" not in self.target_modules and extra:
            raise AdapterError(f"LoRA adapter {name} adapts {sorted(extra)}, which this server's "
                               f"--lora-target-modules {sorted(self.target_modules)} leaves out; restart it with "
                               f"them listed")
        model = self.base.clone_model()
        own = model.state_dict()
        with torch.no_grad():
            for weight, tensor in merged_weights(own, adapter).items():
                own[weight].copy_(tensor)
        engine = LocalEngine(model, self.base.tokenizer, self.base.config)
        if self.base.paused:  # requests sent to it wait for /continue_generation, as the base engine's do
            engine.pause("in_place")
        return _Loaded(name=name, path=path, adapter=adapter, engine=engine, pinned=pinned, seq=next(self._order))

    async def unload(self, name: str) -> None:
        """Stop new requests from naming `name`, wait for its requests in flight, then free its engine."""
        entry = self._loaded.pop(name, None)
        if entry is None:
            raise AdapterError(f"LoRA with name {name} does not exist. Loaded LoRAs: {sorted(self._loaded)}")
        self._draining.append(entry)
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: entry.in_flight == 0)
        finally:
            self._draining.remove(entry)
            await entry.engine.close()

    async def rebase(self, on_running: str) -> None:
        """Merge every loaded adapter again onto the base engine's weights, which just changed."""
        base = self.base.model.state_dict()
        for entry in list(self._loaded.values()):  # an unload may run while this awaits
            weights = {**base, **merged_weights(base, entry.adapter)}
            await entry.engine.update_weights(weights, on_running=on_running)

    def close_sync(self) -> None:
        for entry in [*self._loaded.values(), *self._draining]:
            entry.engine.close_sync()


__all__ = ["LoraAdapters", "tied_weights"]
