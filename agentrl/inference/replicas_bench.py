"""Rollout throughput of 2 single-thread engine replicas against 1 (`engine.replicas`), side by side, as a ratio.

    agentrl bench replicas                     # small model, 64 episodes x 3 turns x 32 tokens, 2 rounds per side
    agentrl bench replicas --quick             # tiny model, a few short episodes: checks the bench end to end
    agentrl bench replicas --model runs/quickstart/sft --replicas 1,2,4
    agentrl bench replicas --kill              # fault figures instead: replica_faults_bench.py

Engine-bound episodes, no tools: every episode is `--turns` turns; each turn is one greedy generate of exactly
`--tokens` tokens (ignore_eos, so every side produces the same tokens) under the episode's session id, followed by
an 8-token observation appended to its context. All `--episodes` episodes run at once. Sides, one after another on
one local Ray: the in-process LocalEngine (`engine.replicas: 1`, one torch thread: what a run without replicas
gets), then a ReplicatedEngine of each count in `--replicas`, every replica a Ray actor with one thread and one
Ray CPU. Each side runs one warm-up round, then `--rounds` measured rounds; its row is the median round.
Columns: tokens/s and episodes/s (wall clock), the ratio of tokens/s to the first replicated side's, the measured
rounds' requests per replica, and whether every episode's tokens equal the in-process engine's (greedy: they must).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from agentrl.inference.bench_episodes import OBSERVATION_TOKENS, observation, random_prompts, vocab_size

QUICK = {"size": "tiny", "episodes": 8, "turns": 2, "tokens": 8, "rounds": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="an HF model dir (default: build the offline tiny model)")
    parser.add_argument("--size", default="small", help="size of the built model (agentrl.models.tiny.SIZES)")
    parser.add_argument("--replicas", default="1,2", help="replica counts to measure, comma-separated")
    parser.add_argument("--episodes", type=int, default=64, help="concurrent episodes per round")
    parser.add_argument("--turns", type=int, default=3, help="turns per episode")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per turn")
    parser.add_argument("--prompt-len", type=int, default=64, help="first-turn prompt tokens")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per side (after one warm-up)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="engine.max_batch_size of every engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, 8 episodes x 2 turns x 8 tokens, 1 round: checks the bench end to end")
    parser.add_argument("--kill", action="store_true",
                        help="fault figures instead: the same rollout on the largest --replicas count with and "
                             "without replica 0 killed mid-rollout (episodes retried, lost, time to recover)")


async def _round(engine, prompts: list[list[int]], turns: int, tokens: int, tag: str, vocab: int):
    """All episodes at once; returns (wall s, tokens generated, each episode's generated ids)."""
    from agentrl.types import SamplingParams

    params = SamplingParams(max_new_tokens=tokens, temperature=0, ignore_eos=True)

    async def episode(i: int) -> list[int]:
        ids, out = list(prompts[i]), []
        for turn in range(turns):
            gen = await engine.generate(ids, params, session_id=f"{tag}-ep{i}")
            out += gen.token_ids
            ids += gen.token_ids + observation(i, turn, vocab)
        return out

    t0 = time.perf_counter()
    outputs = await asyncio.gather(*[episode(i) for i in range(len(prompts))])
    return time.perf_counter() - t0, sum(len(o) for o in outputs), outputs


async def _measure(engine, args, vocab: int) -> dict:
    prompts = random_prompts(args.episodes, args.prompt_len, vocab, args.seed)
    await _round(engine, random_prompts(args.episodes, args.prompt_len, vocab, args.seed + 1), args.turns, args.tokens,
                 "warm-up", vocab)
    replicated = hasattr(engine, "replica_stats")
    before = await engine.replica_stats() if replicated else {}
    rounds = [await _round(engine, prompts, args.turns, args.tokens, f"round{r}", vocab) for r in range(args.rounds)]
    wall = statistics.median(r[0] for r in rounds)
    row = {"wall_s": wall, "tokens_per_s": rounds[0][1] / wall, "episodes_per_s": args.episodes / wall,
           "outputs": rounds[0][2], "per_replica": "-"}
    if replicated:
        after = await engine.replica_stats()
        row["per_replica"] = "/".join(str(after[i]["requests"] - before[i]["requests"]) for i in sorted(after))
    return row


def _side(path: Path, replicas: int, args) -> dict:
    from agentrl.inference.config import EngineConfig

    config = EngineConfig(max_batch_size=args.max_batch_size, num_threads=1, replicas=max(replicas, 1),
                          max_model_len=args.prompt_len + args.turns * (args.tokens + OBSERVATION_TOKENS) + 1)
    if replicas == 0:  # the in-process engine
        from agentrl.inference.local import LocalEngine

        engine = LocalEngine.from_pretrained(path, config)
        try:
            return asyncio.run(_measure(engine, args, vocab_size(path)))
        finally:
            engine.close_sync()
    from agentrl.inference.replica_actor import start_replicas

    engine = start_replicas(path, config)

    async def go() -> dict:
        try:
            return await _measure(engine, args, vocab_size(path))
        finally:
            await engine.close()

    return asyncio.run(go())


def run(args) -> int:
    from agentrl.console import quiet_third_party
    from agentrl.errors import UserError
    from agentrl.services import start_ray

    quiet_third_party()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    try:
        counts = [int(x) for x in args.replicas.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"--replicas {args.replicas!r}: give replica counts >= 1, comma-separated, e.g. 1,2")
    if args.kill and (max(counts) < 2 or args.turns < 2):
        raise UserError(f"--kill needs a replica to survive and a turn after the kill: --replicas {args.replicas} "
                        f"and --turns {args.turns} were given; pass at least 2 of each")
    tmp = None
    if args.model:
        path = Path(args.model)
    else:
        from agentrl.models.tiny import build_tiny_model

        tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-replicas-")
        path = build_tiny_model(Path(tmp.name) / args.size, size=args.size, seed=args.seed)
    import ray

    # a Ray started here counts at least one CPU per replica, so the largest side starts on a smaller host too
    started = start_ray(num_cpus=max(os.cpu_count() or 1, *counts), log_to_driver=False)
    if args.kill:
        from agentrl.inference.replica_faults_bench import run_kill

        try:
            print(f"== {max(counts)} replicas, replica 0 killed mid-rollout or not: {args.episodes} concurrent "
                  f"episodes x {args.turns} turns x {args.tokens} tokens (greedy, ignore_eos), model {path.name}",
                  flush=True)
            return run_kill(path, max(counts), args)
        finally:
            if started:
                ray.shutdown()
            if tmp is not None:
                tmp.cleanup()
    try:
        print(f"== {args.episodes} concurrent episodes x {args.turns} turns x {args.tokens} tokens (greedy, "
              f"ignore_eos), {args.prompt_len}-token prompts, model {path.name}, {args.rounds} measured round(s) "
              f"per side; Ray CPUs {ray.cluster_resources().get('CPU', 0):g}", flush=True)
        rows = []
        for replicas in [0, *counts]:
            label = "in-process LocalEngine" if replicas == 0 else f"{replicas} replica(s)"
            rows.append((label, _side(path, replicas, args)))
            print(f"  measured {label}", flush=True)
    finally:
        if started:
            ray.shutdown()
        if tmp is not None:
            tmp.cleanup()
    base = rows[1][1]["tokens_per_s"]
    reference = rows[0][1]["outputs"]
    print(f"\n{'side':24s} {'wall s':>8s} {'tokens/s':>10s} {'episodes/s':>11s} {'ratio':>7s} "
          f"{'requests per replica':>21s}  same tokens")
    for label, row in rows:
        same = sum(a == b for a, b in zip(row["outputs"], reference))
        print(f"{label:24s} {row['wall_s']:8.2f} {row['tokens_per_s']:10.1f} {row['episodes_per_s']:11.2f} "
              f"{row['tokens_per_s'] / base:6.2f}x {row['per_replica']:>21s}  {same}/{len(reference)}")
    print(f"(ratio: tokens/s over the {rows[1][0]} side's)")
    return 0
