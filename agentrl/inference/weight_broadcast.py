"""New weights over a process group instead of the disk: SGLang's weight-broadcast protocol, both ends.

The protocol (sglang 0.5.x, `/init_weights_update_group` + `/update_weights_from_distributed`):

1. The trainer's rank 0 opens a process group of its own with every server: it is rank 0, server i's TP ranks are
   `rank_offset_i .. rank_offset_i + tp_i - 1`, world size `1 + sum(tp_i)`. It posts `/init_weights_update_group`
   (master address and port, rank offset, world size, group name, backend) to every server and joins the
   rendezvous itself at the same time: nobody returns before everybody has joined.
2. Per update, per bucket of about `bucket_bytes`: it posts `/update_weights_from_distributed` (the bucket's
   names, dtypes, shapes) to every server and broadcasts each tensor from rank 0, in order (SGLang's default
   format); or, with `flatten`, the bucket's bytes as one uint8 tensor holding the tensors back to back, each at a
   byte offset its dtype's size divides (`load_format: "flattened_bucket"`, `pack` / `unpack`, SGLang's
   FlattenedTensorBucket layout). A server answers its post once it has received and loaded the bucket.

`WeightBroadcaster` is the sending side (the trainer's rank 0); `agentrl engine serve` is a receiving side on CPU
(`agentrl.inference.server`). The backend is NCCL between GPUs (real SGLang servers) and gloo on CPU; the
rendezvous (`init_weight_group`, a TCP store under the group's name) is the one SGLang uses, so either end may be
SGLang. The group's traffic is not authenticated (SGLang's is not either): the bearer token guards the HTTP routes
that open it, and the servers connect out to the trainer's port, so keep that port inside the cluster's network.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import math
import socket
import time
from dataclasses import dataclass
from typing import Iterable

import httpx
import torch

from agentrl.auth import bearer_headers
from agentrl.errors import one_line

GROUP_NAME = "agentrl_weights"
_TOKEN_KEY = "engine.token_file"
_ANSWER_WAIT_S = 10.0  # after a broken broadcast: how long the servers' answers (which say why) are awaited


class BroadcastError(RuntimeError):
    """A weight broadcast failed: a server refused or did not answer; the message names it."""


# ------------------------------------------------------------------------------------------- process group


def init_weight_group(master_address: str, master_port: int, *, rank: int, world_size: int,
                      group_name: str = GROUP_NAME, backend: str = "gloo", timeout_s: float = 300.0):
    """Join the weight-update process group (blocks until all `world_size` ranks joined, or `timeout_s`).

    The same rendezvous as SGLang's `init_custom_process_group`: a TCP store served by rank 0 at
    master_address:master_port, keys under `group_name`, a group outside the default one (this process may or may
    not have a default group: a trainer rank has its FSDP group, a server none)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = datetime.timedelta(seconds=timeout_s)
    host = f"[{master_address}]" if ":" in master_address else master_address
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                         timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def destroy_weight_group(group) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(group)
    except (RuntimeError, ValueError, KeyError):
        pass  # already gone (a peer died and the group was torn down)


# ------------------------------------------------------------------------------------------- buckets


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # torch dtype name without "torch.", as SGLang's wire carries it ("float32", "bfloat16")
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch_dtype(self.dtype).itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (e.g. float32, bfloat16)")
    return dtype


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of `specs` per bucket, in order: a bucket closes when the next tensor would take it past
    `bucket_bytes` (a tensor larger than that travels alone) or would start at an offset its dtype's size does not
    divide (SGLang refuses unaligned tensors)."""
    buckets: list[list[int]] = []
    size = 0
    for i, spec in enumerate(specs):
        aligned = size % torch_dtype(spec.dtype).itemsize == 0
        if buckets and buckets[-1] and (size + spec.nbytes > bucket_bytes or not aligned):
            buckets.append([])
            size = 0
        if not buckets:
            buckets.append([])
        buckets[-1].append(i)
        size += spec.nbytes
    return buckets


def pack(tensors: list[torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """The tensors' bytes back to back in one uint8 tensor on `device` (the sender's bucket)."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8).to(device) for t in tensors])


def empty_bucket(specs: list[TensorSpec], device: torch.device | str = "cpu") -> torch.Tensor:
    """The receiver's buffer for one bucket (checks the layout before anything is received)."""
    offset = 0
    for spec in specs:
        if any(d < 0 for d in spec.shape):
            raise ValueError(f"{spec.name}: negative dimension in shape {list(spec.shape)}")
        if offset % torch_dtype(spec.dtype).itemsize:
            raise ValueError(f"{spec.name}: byte offset {offset} is not aligned to {spec.dtype}")
        offset += spec.nbytes
    if not specs:
        raise ValueError("an empty bucket: names, dtypes and shapes list no tensor")
    return torch.empty(offset, dtype=torch.uint8, device=device)


def unpack(flat: torch.Tensor, specs: list[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """(name, view) of every tensor of a received bucket."""
    out, offset = [], 0
    for spec in specs:
        out.append((spec.name, flat[offset:offset + spec.nbytes].view(torch_dtype(spec.dtype)).reshape(spec.shape)))
        offset += spec.nbytes
    return out


def specs_from_request(body: dict) -> list[TensorSpec]:
    """The bucket an `/update_weights_from_distributed` body announces (ValueError naming what is malformed)."""
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
        raise ValueError("names, dtypes and shapes must be lists")
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names ({len(names)}), dtypes ({len(dtypes)}) and shapes ({len(shapes)}) differ in length")
    specs = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not isinstance(name, str) or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise ValueError(f"tensor {name!r}: a name must be a string and a shape a list of ints")
        specs.append(TensorSpec(name, str(torch_dtype(dtype)).removeprefix("torch."), tuple(shape)))
    return specs


# ------------------------------------------------------------------------------------------- request bodies


def init_group_body(master_address: str, master_port: int, *, rank_offset: int, world_size: int,
                    group_name: str = GROUP_NAME, backend: str = "gloo") -> dict:
    """`/init_weights_update_group` (SGLang's InitWeightsUpdateGroupReqInput)."""
    return {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}


def bucket_body(specs: list[TensorSpec], *, group_name: str = GROUP_NAME, weight_version: str | None = None,
                flush_cache: bool = True, abort_all_requests: bool = False) -> dict:
    """`/update_weights_from_distributed` for one flattened bucket (SGLang's UpdateWeightsFromDistributedReqInput)."""
    body = {"names": [s.name for s in specs], "dtypes": [s.dtype for s in specs],
            "shapes": [list(s.shape) for s in specs], "group_name": group_name, "load_format": "flattened_bucket",
            "flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


# ------------------------------------------------------------------------------------------- sender


class WeightBroadcaster:
    """The trainer's end: a process group with every server in `urls`, opened on the first `send` (or
    `connect`) and kept for the next; a failed send closes it, and the next send opens a new one.

    `master_address`: this host's address as the servers reach it (the trainer rank's node address on a cluster).
    `backend`: "nccl" for GPU tensors to SGLang, "gloo" on CPU. `timeout_s` bounds the rendezvous, each broadcast
    and each HTTP answer. `flatten`: each bucket travels as one flattened tensor (fewer collectives, for models of
    many small tensors) instead of one broadcast per tensor, which needs no packing copy on either side and is
    faster here (docs/scaling.md). `transport` replaces the network for the HTTP calls (tests)."""

    def __init__(self, urls: list[str], *, master_address: str = "127.0.0.1", backend: str = "gloo",
                 bucket_bytes: int = 256 << 20, timeout_s: float = 300.0, token_file: str | None = None,
                 group_name: str = GROUP_NAME, device: torch.device | str = "cpu",
                 transport: httpx.BaseTransport | None = None, flatten: bool = False):
        if not urls:
            raise ValueError("WeightBroadcaster needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.master_address, self.backend = master_address, backend
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self.group_name, self.device = group_name, torch.device(device)
        self.flatten = flatten
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport,
                                  headers=bearer_headers(token_file, _TOKEN_KEY))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.urls)),
                                                           thread_name_prefix="weight-broadcast")
        self._group = None
        self.groups_opened = 0

    # ---------------------------------------------------------------- group

    @property
    def connected(self) -> bool:
        return self._group is not None

    def connect(self) -> None:
        """Open the group: ask each server its TP size, post `/init_weights_update_group` to all, join as rank 0."""
        if self._group is not None:
            return
        tp_sizes = [self._tp_size(url) for url in self.urls]
        offsets = [1 + sum(tp_sizes[:i]) for i in range(len(self.urls))]
        world_size = 1 + sum(tp_sizes)
        port = _free_port(self.master_address)
        posts = [self._pool.submit(self._post, url, "/init_weights_update_group", init_group_body(
            self.master_address, port, rank_offset=offset, world_size=world_size, group_name=self.group_name,
            backend=self.backend)) for url, offset in zip(self.urls, offsets)]
        joiner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-group")
        joining = joiner.submit(init_weight_group, self.master_address, port, rank=0, world_size=world_size,
                                group_name=self.group_name, backend=self.backend, timeout_s=self.timeout_s)
        joiner.shutdown(wait=False)
        while not joining.done():  # a server that refused never joins: say so now, not after the timeout
            failure = _first_failure(posts)
            if failure:
                raise BroadcastError(f"opening the weight-update group failed: {failure}")
            time.sleep(0.01)
        try:
            group = joining.result()
        except Exception as e:  # the rendezvous timed out: say which server did not join, if one said why
            raise BroadcastError(f"opening the weight-update group with {len(self.urls)} server(s) failed: "
                                 f"{_first_failure(posts, _ANSWER_WAIT_S) or one_line(e)}") from None
        failure = _first_failure(posts, self.timeout_s)
        if failure:
            destroy_weight_group(group)
            raise BroadcastError(f"opening the weight-update group failed: {failure}")
        self._group = group
        self.groups_opened += 1

    def close(self) -> None:
        """Leave the group (servers are told with `/destroy_weights_update_group`, best effort)."""
        if self._group is not None:
            for url in self.urls:
                try:
                    self._http.post(f"{url}/destroy_weights_update_group", json={"group_name": self.group_name},
                                    timeout=10.0)
                except httpx.HTTPError:
                    pass
            destroy_weight_group(self._group)
            self._group = None

    def shutdown(self) -> None:
        self.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # ---------------------------------------------------------------- send

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, weight_version: str | None = None,
             abort_all_requests: bool = False, flush_cache: bool = True) -> dict[str, float]:
        """Broadcast the tensors to every server, bucket by bucket; returns timing and size metrics. The servers
        take `weight_version` with the last bucket (their label changes once everything arrived), abort their
        requests with the first when `abort_all_requests`, and flush their caches with the last."""
        t0 = time.perf_counter()
        named = list(named_tensors)
        specs = [TensorSpec.of(name, tensor) for name, tensor in named]
        buckets = plan_buckets(specs, self.bucket_bytes)
        opened = not self.connected
        self.connect()
        t1 = time.perf_counter()
        try:
            for i, indices in enumerate(buckets):
                last = i == len(buckets) - 1
                body = bucket_body([specs[j] for j in indices], group_name=self.group_name,
                                   weight_version=weight_version if last else None, flush_cache=flush_cache and last,
                                   abort_all_requests=abort_all_requests and i == 0)
                if not self.flatten:
                    body.pop("load_format")
                self._send_bucket(body, [pack([named[j][1] for j in indices], self.device)] if self.flatten
                                  else [named[j][1].detach().contiguous().to(self.device) for j in indices])
        except BaseException:
            self.close()  # the servers may be mid-receive: the next send starts from a fresh group
            raise
        return {"timing/weight_connect_s": t1 - t0, "timing/weight_broadcast_s": time.perf_counter() - t1,
                "weight_sync/buckets": float(len(buckets)), "weight_sync/mb": sum(s.nbytes for s in specs) / 2**20,
                "weight_sync/group_opened": float(opened)}

    def _send_bucket(self, body: dict, tensors: list[torch.Tensor]) -> None:
        """Post the bucket to every server and broadcast its tensors (one flattened tensor, or each in order)."""
        import torch.distributed as dist

        posts = [self._pool.submit(self._post, url, "/update_weights_from_distributed", body) for url in self.urls]
        works = [dist.broadcast(t, group_src=0, group=self._group, async_op=True) for t in tensors]
        deadline = time.monotonic() + self.timeout_s
        while not all(work.is_completed() for work in works):  # a server that refused never joins: say so now
            failure = _first_failure(posts)
            if failure:
                raise BroadcastError(f"weight broadcast stopped: {failure}")
            if time.monotonic() > deadline:
                raise BroadcastError(f"weight broadcast of {len(body['names'])} tensors to {len(self.urls)} server(s) "
                                     f"did not finish within {self.timeout_s:g}s")
            time.sleep(0.002)
        try:
            for work in works:
                work.wait()
        except RuntimeError as e:  # a peer left the group (it refused the bucket, or died): its answer says why
            raise BroadcastError(f"weight broadcast stopped: {_first_failure(posts, _ANSWER_WAIT_S) or one_line(e)}") \
                from None
        failure = _first_failure(posts, self.timeout_s)
        if failure or not all(post.done() for post in posts):
            late = f"a server did not answer within {self.timeout_s:g}s"
            raise BroadcastError(f"weight broadcast: {failure or late}")

    # ---------------------------------------------------------------- HTTP

    def _tp_size(self, url: str) -> int:
        try:
            r = self._http.get(f"{url}/get_server_info", timeout=30.0)
        except httpx.HTTPError as e:
            raise BroadcastError(f"{url}/get_server_info: {type(e).__name__}: {e}") from None
        if r.status_code == 401:
            raise BroadcastError(f"{url} refused the token (401): check {_TOKEN_KEY}")
        info = r.json() if r.status_code == 200 else {}
        return int(info.get("tp_size") or 1)

    def _post(self, url: str, path: str, body: dict) -> str | None:
        """None on success, else one line naming the server and what it said."""
        try:
            r = self._http.post(f"{url}{path}", json=body)
        except httpx.HTTPError as e:
            return f"{url}{path}: {type(e).__name__}: {e}"
        try:
            data = r.json()
        except ValueError:
            data = {"message": r.text[:300]}
        if r.status_code != 200 or (isinstance(data, dict) and data.get("success") is False):
            message = data.get("message") or data.get("error") if isinstance(data, dict) else data
            return f"{url}{path}: HTTP {r.status_code}: {message}"
        return None


def _first_failure(posts: list[concurrent.futures.Future], wait_s: float = 0.0) -> str | None:
    """The first failure among the posts answered within `wait_s` seconds (0: those answered already)."""
    concurrent.futures.wait(posts, timeout=wait_s)
    for post in posts:
        if post.done():
            error = post.exception() or post.result()
            if error:
                return str(error)
    return None


def _free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


__all__ = ["GROUP_NAME", "BroadcastError", "TensorSpec", "WeightBroadcaster", "bucket_body", "destroy_weight_group",
           "empty_bucket", "init_group_body", "init_weight_group", "pack", "plan_buckets", "specs_from_request",
           "torch_dtype", "unpack"]
