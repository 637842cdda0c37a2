"""`agentrl bench weight-sync`: one step's weight sync to SGLang-protocol servers, disk vs broadcast, side by side.

Both sides start from the trainer's rank 0 (a Ray actor, as in a run) and end when every server serves the new
weights, as `push_weights` does each step: "disk" gathers the state dict to the driver (through shared memory:
rank 0 runs on this host), writes an HF checkpoint under RUN_DIR/weights and has every server load it
(/update_weights_from_disk); "broadcast" has rank 0 send it to every server over a gloo process group in buckets
(/update_weights_from_distributed). The servers are `agentrl
engine serve` processes on loopback (one thread each); the sides alternate round by round after one warm-up
round each (the broadcast's warm-up opens its group, which later rounds reuse). Each round's result is checked:
every server reports the round's weight version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("disk", "broadcast")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="an HF model dir (default: build the offline model --size)")
    parser.add_argument("--size", default="small",
                        help="size of the built model (agentrl.models.tiny.SIZES; 'base' is ~100M parameters)")
    parser.add_argument("--servers", type=int, default=2, help="engine servers that receive the weights")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per side (after one warm-up each)")
    parser.add_argument("--bucket-mb", type=float, default=256.0, help="engine.weight_bucket_mb of the broadcast")
    parser.add_argument("--flatten", action="store_true",
                        help="broadcast each bucket as one flattened tensor instead of tensor by tensor")


async def _push(side: str, workers, engine, step: int, args, model: Path, run_dir: Path) -> dict[str, float]:
    from agentrl.trainer.weight_sync import broadcast_weights, sync_weights

    t0 = time.perf_counter()
    if side == "broadcast":
        metrics = await broadcast_weights(workers, engine, step=step, token_file=None, bucket_mb=args.bucket_mb,
                                          flatten=args.flatten, timeout_s=600.0)
    else:
        weights = await asyncio.to_thread(workers.engine_state_dict)  # as push_weights: shared memory on one host
        metrics = await sync_weights(weights, engine, backend="sglang", model_path=str(model), run_dir=run_dir,
                                     step=step)
    labels = await engine.weight_labels()
    if labels != [str(step)] * len(labels):
        raise RuntimeError(f"{side} round {step}: the servers serve {labels}, not version {step}")
    return {**metrics, "total_s": time.perf_counter() - t0}


async def _measure(workers, engine, args, model: Path, run_dir: Path) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    step = 0
    for round_ in range(args.rounds + 1):
        for side in SIDES if round_ % 2 == 0 else reversed(SIDES):  # neither side always goes first
            step += 1
            metrics = await _push(side, workers, engine, step, args, model, run_dir)
            if round_:  # round 0 warms both up (and opens the broadcast's group)
                results[side].append(metrics)
            else:
                print(f"warm-up {side}: {metrics['total_s']:.3f} s"
                      + (f" (opening the group {metrics['timing/weight_connect_s']:.3f} s)" if side == "broadcast"
                         else ""), flush=True)
    return results


def run(args) -> int:
    import ray

    from agentrl.console import quiet_third_party
    from agentrl.errors import UserError
    from agentrl.inference import EngineConfig
    from agentrl.inference.sglang import SGLangEngine
    from agentrl.services import free_port, run_service, start_ray
    from agentrl.trainer.config import ActorConfig, ModelConfig
    from agentrl.trainer.worker import WorkerGroup

    quiet_third_party()
    if args.servers < 1 or args.rounds < 1:
        raise UserError(f"--servers {args.servers} and --rounds {args.rounds}: give at least 1 of each")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentrl-bench-weight-sync-")))
        if args.model:
            model = Path(args.model)
        else:
            from agentrl.models.tiny import build_tiny_model

            model = build_tiny_model(tmp / args.size, size=args.size, seed=0)
        run_dir = tmp / "run"
        (run_dir / "weights").mkdir(parents=True)
        urls = []
        for i in range(args.servers):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            stack.enter_context(run_service(
                [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(model), "--port", str(port),
                 "--num-threads", "1", "--weights-dir", str(run_dir / "weights")], f"{urls[-1]}/health",
                name=f"engine server {i}", timeout_s=300))
        if start_ray(num_cpus=2, log_to_driver=False):
            stack.callback(ray.shutdown)
        workers = WorkerGroup(ModelConfig(path=str(model)), ActorConfig(world_size=1))
        stack.callback(workers.shutdown)
        engine = SGLangEngine(urls, EngineConfig(backend="sglang", urls=urls))

        async def go() -> dict:
            try:
                return await _measure(workers, engine, args, model, run_dir)
            finally:
                await engine.close()

        results = asyncio.run(go())
    mb = results["broadcast"][0]["weight_sync/mb"]
    print(f"== weight sync of model {model.name} ({mb:.0f} MB sent) to {args.servers} engine server(s), median of "
          f"{args.rounds} round(s) per side; broadcast buckets of {args.bucket_mb:g} MB"
          + (", flattened" if args.flatten else ", tensor by tensor"), flush=True)
    print(f"{'side':<10} {'total s':>8}  parts")
    disk = statistics.median(r["total_s"] for r in results["disk"])
    for side in SIDES:
        rows = results[side]
        parts = ("timing/weight_write_s", "timing/weight_push_s") if side == "disk" else (
            "timing/weight_broadcast_s", "weight_sync/buckets")
        detail = ", ".join(f"{p.split('/')[1]} {statistics.median(r[p] for r in rows):.3f}" for p in parts)
        print(f"{side:<10} {statistics.median(r['total_s'] for r in rows):>8.3f}  {detail}")
    broadcast = statistics.median(r["total_s"] for r in results["broadcast"])
    print(f"broadcast / disk: {broadcast / disk:.2f}x the time")
    return 0


__all__ = ["add_arguments", "run"]
