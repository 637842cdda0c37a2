"""The weight broadcast's pieces without servers: bucket plans, the flattened layout, request bodies, a broadcast
between two threads over gloo, and a refusal that fails fast instead of waiting out the rendezvous."""

from __future__ import annotations

import multiprocessing

import httpx
import pytest
import torch

from agentrl.inference.weight_broadcast import (
    BroadcastError,
    TensorSpec,
    WeightBroadcaster,
    bucket_body,
    destroy_weight_group,
    empty_bucket,
    init_weight_group,
    pack,
    plan_buckets,
    specs_from_request,
    unpack,
)
from agentrl.services import free_port


def spec(name: str, dtype: str, *shape: int) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape))


def test_buckets_close_at_the_size_limit_and_a_big_tensor_travels_alone():
    specs = [spec("a", "float32", 10), spec("b", "float32", 10), spec("big", "float32", 100), spec("c", "float32", 5)]
    assert plan_buckets(specs, bucket_bytes=80) == [[0, 1], [2], [3]]
    assert plan_buckets(specs, bucket_bytes=10_000) == [[0, 1, 2, 3]]


def test_a_tensor_that_would_start_unaligned_opens_a_new_bucket():
    specs = [spec("odd", "bfloat16", 3), spec("f32", "float32", 2), spec("f32b", "float32", 2)]
    assert plan_buckets(specs, bucket_bytes=1 << 20) == [[0], [1, 2]]  # 6 bytes: a float32 cannot start there


def test_pack_and_unpack_round_trip_mixed_dtypes():
    tensors = {"w": torch.randn(3, 4), "i": torch.arange(6).view(2, 3), "h": torch.randn(5).to(torch.bfloat16)}
    specs = [TensorSpec.of(name, t) for name, t in tensors.items()]
    assert [s.dtype for s in specs] == ["float32", "int64", "bfloat16"]
    flat = pack(list(tensors.values()))
    assert flat.dtype == torch.uint8 and flat.numel() == sum(s.nbytes for s in specs)
    for name, view in unpack(flat, specs):
        assert torch.equal(view, tensors[name])


def test_a_receive_buffer_checks_the_layout_before_anything_arrives():
    assert empty_bucket([spec("a", "float32", 2, 3)]).numel() == 24
    with pytest.raises(ValueError, match="byte offset 2 is not aligned to float32"):
        empty_bucket([spec("h", "float16", 1), spec("f", "float32", 1)])
    with pytest.raises(ValueError, match="negative dimension"):
        empty_bucket([spec("a", "float32", -1)])
    with pytest.raises(ValueError, match="empty bucket"):
        empty_bucket([])


def test_request_bodies_are_read_back_and_malformed_ones_named():
    specs = [spec("model.norm.weight", "float32", 8), spec("lm_head.weight", "bfloat16", 4, 8)]
    body = bucket_body(specs, weight_version="3", flush_cache=False)
    assert body["load_format"] == "flattened_bucket" and body["weight_version"] == "3"
    assert specs_from_request(body) == specs
    assert "weight_version" not in bucket_body(specs)  # only the update's last bucket carries the label
    with pytest.raises(ValueError, match="differ in length"):
        specs_from_request({"names": ["a"], "dtypes": [], "shapes": [[1]]})
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        specs_from_request({"names": ["a"], "dtypes": ["float99"], "shapes": [[1]]})
    with pytest.raises(ValueError, match="a shape a list of ints"):
        specs_from_request({"names": ["a"], "dtypes": ["float32"], "shapes": ["1"]})


def _receive_and_check(port: int, specs: list[TensorSpec], seed: int) -> None:
    """The receiving rank (its own process: a group name is registered once per process)."""
    group = init_weight_group("127.0.0.1", port, rank=1, world_size=2, group_name="unit", timeout_s=60)
    flat = empty_bucket(specs)
    torch.distributed.broadcast(flat, group_src=0, group=group)
    destroy_weight_group(group)
    expected = _tensors(seed)
    assert all(torch.equal(view, expected[name]) for name, view in unpack(flat, specs))


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(4, 4, generator=generator), "b": torch.randn(7, generator=generator)}


def test_two_processes_share_a_bucket_over_a_gloo_group():
    port = free_port()
    sent = _tensors(seed=3)
    specs = [TensorSpec.of(name, t) for name, t in sent.items()]
    receiver = multiprocessing.get_context("spawn").Process(target=_receive_and_check, args=(port, specs, 3))
    receiver.start()
    try:
        group = init_weight_group("127.0.0.1", port, rank=0, world_size=2, group_name="unit", timeout_s=60)
        torch.distributed.broadcast(pack(list(sent.values())), group_src=0, group=group)
        destroy_weight_group(group)
    finally:
        receiver.join(60)
    assert receiver.exitcode == 0  # the receiver found the bytes it expected


def test_a_server_that_refuses_the_group_fails_the_push_at_once_by_name():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json={"tp_size": 1})
        return httpx.Response(400, json={"success": False, "message": "backend 'gloo' is not supported here"})

    sender = WeightBroadcaster(["http://engine-a:30000"], timeout_s=120, transport=httpx.MockTransport(answer))
    try:  # "group failed:", not "group with 1 server(s) failed:" (the message after waiting out the rendezvous)
        with pytest.raises(BroadcastError, match=r"^opening the weight-update group failed: http://engine-a:30000/"
                                                 r"init_weights_update_group: HTTP 400: backend 'gloo' is not "):
            sender.send([("w", torch.zeros(2))], weight_version="1")
    finally:
        sender.shutdown()
