"""Engine replicas as Ray actors: a LocalEngine in each, and the driver's handle on one (`RayReplica`).

`start_replicas` makes the ReplicatedEngine that `make_engine` returns for `engine.replicas` > 1 (backend "local"):
it starts N actors at once, each asking Ray for `engine.num_threads` CPUs (1 when unset: one torch thread per
replica, so N replicas use N cores), a GPU when `engine.device` is "cuda", and `engine.replica_resources`. Ray
places them wherever the cluster has room; every node must be able to read the model directory.

Weights travel through Ray's object store (`share_weights`): the driver puts the state dict there once per update
as numpy arrays, which every replica on a node maps without a copy and copies into its model.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.exceptions
import torch

from agentrl.inference.base import EngineError
from agentrl.inference.config import EngineConfig
from agentrl.inference.replicas import ReplicaDiedError, ReplicatedEngine, model_max_len
from agentrl.types import Generation, SamplingParams

log = logging.getLogger(__name__)

_NUMPY_VIEW = {torch.bfloat16: np.int16}  # torch dtypes numpy lacks travel as same-width integers
_CONTROL_CALLS = 16  # room for health checks and weight updates beside a full queue of generate calls


class EngineReplicaActor:
    """One LocalEngine, in a Ray actor. Async methods, so generate calls run concurrently on the actor's loop and
    the engine batches them."""

    def __init__(self, model_path: str, config: EngineConfig):
        from agentrl.inference.local import LocalEngine

        torch.set_num_threads(config.num_threads or 1)  # the loading thread; the decode thread sets its own
        self.engine = LocalEngine.from_pretrained(model_path, config)
        self.requests = 0

    async def generate(self, input_ids: list[int], params: SamplingParams, session_id: str | None,
                       request_id: str) -> Generation:
        self.requests += 1
        return await self.engine.generate(input_ids, params, session_id=session_id, request_id=request_id)

    async def update_weights(self, weights: Any, version: int, on_running: str) -> int:
        if isinstance(weights, dict):
            weights = unpack_weights(weights)
        await self.engine.update_weights(weights, version=version, on_running=on_running)
        return self.engine.weight_version

    async def ping(self) -> dict:
        return {"weight_version": self.engine.weight_version, "node": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def pause(self, mode: str) -> int:
        return await asyncio.to_thread(self.engine.pause, mode)

    async def resume(self) -> None:
        self.engine.resume()

    async def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    async def abort_all(self) -> int:
        return self.engine.abort_all()

    async def stats(self) -> dict:
        return {**self.engine.stats, "requests": self.requests, "weight_version": self.engine.weight_version}

    async def close(self) -> None:
        await self.engine.close()


def pack_weights(state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (numpy array, torch dtype name): what Ray's object store holds without pickling tensor storages
    (a view into a shared-memory file pickles as its whole file) and replicas read without a copy."""
    out = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu()
        view = _NUMPY_VIEW.get(t.dtype)
        out[name] = ((t.view(torch.int16) if view is not None else t).numpy(), str(t.dtype).removeprefix("torch."))
    return out


def unpack_weights(packed: Mapping[str, tuple[np.ndarray, str]]) -> dict[str, torch.Tensor]:
    """The state dict `pack_weights` packed, as tensors over the arrays (read-only: the engine copies them)."""
    out = {}
    with warnings.catch_warnings():  # arrays from the object store are read-only; nothing writes to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, (array, dtype_name) in packed.items():
            out[name] = torch.from_numpy(array).view(getattr(torch, dtype_name))
    return out


def share_weights(state_dict: Mapping[str, torch.Tensor]) -> ray.ObjectRef:
    """Put the state dict in Ray's object store once; every replica's update_weights receives the reference."""
    return ray.put(pack_weights(state_dict))


class RayReplica:
    """The driver's handle on one EngineReplicaActor (the `Replica` protocol of `replicas.py`)."""

    def __init__(self, index: int, model_path: str, config: EngineConfig):
        self.index = index
        self.name = f"engine replica {index}"
        self.info: dict = {}  # its last health check's answer: weight version, node, node id, pid
        cuda = config.device.startswith("cuda")
        threads = config.num_threads or 1
        replica_config = config.model_copy(update={"replicas": 1, "num_threads": threads,
                                                   "device": "cuda" if cuda else config.device})
        self.actor = ray.remote(EngineReplicaActor).options(
            num_cpus=threads, num_gpus=1 if cuda else 0, resources=dict(config.replica_resources) or None,
            max_concurrency=config.max_queued_requests + config.max_batch_size + _CONTROL_CALLS,
        ).remote(model_path, replica_config)

    async def _call(self, method: str, *args):
        try:
            return await getattr(self.actor, method).remote(*args)
        except ray.exceptions.RayActorError as e:
            raise ReplicaDiedError(f"{self.name} died: {_first_line(e)}") from None
        except ray.exceptions.RayTaskError as e:  # the call itself raised: the caller gets that error
            cause = e.cause if isinstance(e.cause, Exception) else EngineError(f"{self.name}: {_first_line(e)}")
            raise cause from None

    async def generate(self, input_ids: list[int], params: SamplingParams, session_id: str | None,
                       request_id: str) -> Generation:
        try:
            return await self._call("generate", input_ids, params, session_id, request_id)
        except asyncio.CancelledError:  # the caller gave up (episode timeout): free the replica's slot
            self.actor.abort.remote(request_id)
            raise

    async def update_weights(self, weights: Any, version: int, on_running: str) -> int:
        return await self._call("update_weights", weights, version, on_running)

    async def ping(self) -> dict:
        info = await self._call("ping")
        self.info, self.name = info, _name(self.index, info)
        return info

    async def pause(self, mode: str) -> int:
        return await self._call("pause", mode)

    async def resume(self) -> None:
        await self._call("resume")

    async def abort(self, request_id: str) -> bool:
        return await self._call("abort", request_id)

    async def abort_all(self) -> int:
        return await self._call("abort_all")

    async def stats(self) -> dict:
        return await self._call("stats")

    async def close(self) -> None:
        await self._call("close")

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except (ValueError, ray.exceptions.RayError):
            pass  # already gone


def start_replicas(model_path: str | Path, config: EngineConfig) -> ReplicatedEngine:
    """`config.replicas` LocalEngine actors, each answering its health check within engine.replica_timeout_s,
    behind one ReplicatedEngine. Starts a local Ray when none is up (closing the engine stops it)."""
    from transformers import AutoTokenizer

    from agentrl.inference.local import ModelNotFoundError
    from agentrl.services import start_ray

    path = Path(model_path).resolve()  # actors may not share the driver's working directory
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} is not a Hugging Face model directory (no config.json): "
                                 f"build one with `agentrl init-model` or pass a downloaded model dir")
    started = start_ray()
    needed, free = config.replicas * (config.num_threads or 1), ray.available_resources().get("CPU", 0.0)
    if free < needed:  # an autoscaler may add room; a fixed cluster will not, and start-up waits for the timeout
        log.warning("%d engine replicas need %g Ray CPUs, %g are free now: they wait for room up to "
                    "engine.replica_timeout_s=%gs (a local Ray's CPUs are a count: raise trainer.ray_num_cpus)",
                    config.replicas, needed, free, config.replica_timeout_s)
    try:
        replicas = [RayReplica(i, str(path), config) for i in range(config.replicas)]
        _wait_started(replicas, config)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    return ReplicatedEngine(replicas, config, spawn=lambda i: RayReplica(i, str(path), config), share=share_weights,
                            tokenizer=AutoTokenizer.from_pretrained(path), max_model_len=model_max_len(path, config),
                            model_path=str(path), on_close=ray.shutdown if started else None)


def _wait_started(replicas: list[RayReplica], config: EngineConfig) -> None:
    """Block until every replica answers a ping; a replica that failed or did not answer in time is named.
    (Blocking, as LocalEngine's constructor is: `make_engine` is synchronous, and may run inside an event loop.)"""
    refs = {r.actor.ping.remote(): r for r in replicas}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=config.replica_timeout_s)
    problems = []
    for ref, replica in refs.items():
        if ref not in ready:
            problems.append(f"{replica.name}: no answer")
            continue
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError as e:
            problems.append(f"{replica.name}: {_first_line(e)}")
        else:
            replica.info, replica.name = info, _name(replica.index, info)
    if problems:
        for r in replicas:
            r.kill()
        threads = config.num_threads or 1
        raise EngineError(f"{len(problems)} of {len(replicas)} engine replicas did not start within "
                          f"engine.replica_timeout_s={config.replica_timeout_s:g}s ({'; '.join(problems)}); each "
                          f"needs {threads} free Ray CPU(s)" + (f" and {dict(config.replica_resources)}"
                                                               if config.replica_resources else "") +
                          " on a node that can read the model (`ray status` shows what is free)")


def _name(index: int, info: dict) -> str:
    return f"engine replica {index} (node {info['node']}, pid {info['pid']})"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


__all__ = ["EngineReplicaActor", "RayReplica", "pack_weights", "share_weights", "start_replicas",
           "unpack_weights"]
