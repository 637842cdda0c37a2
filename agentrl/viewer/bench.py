"""viewer: time to the first page of a large synthetic run (episodes.jsonl written by the real writer)"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--n", type=int, default=8, help="episodes per group")
    parser.add_argument("--groups-per-step", type=int, default=16)
    parser.add_argument("--response-tokens", type=int, default=400, help="response tokens per episode (mean)")
    parser.add_argument("--run-dir", default=None, help="write the synthetic run here (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)


def synthetic_run(run_dir: str | Path, *, episodes: int, n: int = 8, groups_per_step: int = 16,
                  response_tokens: int = 400, seed: int = 0) -> Path:
    """A run directory with `episodes` episodes (3 turns, 2 tool calls each, realistic token-list sizes) in
    episodes.jsonl and one metrics.jsonl row per step. Returns the run dir."""
    from agentrl.agent_loop.rollout import write_episodes
    from agentrl.types import Episode

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    per_step = n * groups_per_step
    steps = (episodes + per_step - 1) // per_step
    made = 0
    with (run_dir / "metrics.jsonl").open("w") as metrics:
        for step in range(1, steps + 1):
            batch = []
            for k in range(min(per_step, episodes - made)):
                group, sample = divmod(k, n)
                length = max(8, int(rng.gauss(response_tokens, response_tokens / 4)))
                mask = [1 if (j // 40) % 3 != 2 else 0 for j in range(length)]
                reward = float(rng.random() < 0.4)
                kinds = ["bad_arguments"] if rng.random() < 0.1 else []
                batch.append(Episode(
                    uid=f"step{step}-0-task{group}", prompt_ids=[rng.randrange(1000) for _ in range(120)],
                    response_ids=[rng.randrange(150_000) for _ in range(length)], response_mask=mask,
                    response_logprobs=[-rng.random() * 3 if m else 0.0 for m in mask],
                    messages=[{"role": "user", "content": f"Question {group} of step {step}: what is {k} + 1?"},
                              {"role": "assistant", "content": "Let me compute. " * 20},
                              {"role": "tool", "name": "calculator", "content": str(k + 1)},
                              {"role": "assistant", "content": f"<answer>{k + 1}</answer>"}],
                    reward=reward, finish_reason="stop" if rng.random() < 0.9 else "length", num_turns=3,
                    tool_calls=[{"turn": 0, "name": "calculator", "arguments": {"expr": f"{k}+1"}, "ok": not kinds,
                                 "error_kind": kinds[0] if kinds else None, "latency_s": 0.01}],
                    infra_error=rng.random() < 0.01, data_source=rng.choice(["calc", "lookup"]),
                    task_id=f"t{group}", turn_ids=[0 if m else -1 for m in mask],
                    episode_id=f"step{step}-0-task{group}-{sample}"))
            made += len(batch)
            write_episodes(run_dir / "episodes.jsonl", batch, step=step, n=n)
            metrics.write(f'{{"step": {step}, "reward/mean": {rng.random():.4f}, "actor/entropy": '
                          f'{1 + rng.random():.4f}, "timing/step_s": {10 + rng.random():.3f}}}\n')
    return run_dir


def first_page_s(run_dir: str | Path) -> tuple[float, dict]:
    """Seconds from creating the app on `run_dir` to having the page, /api/run and the first page of groups."""
    from fastapi.testclient import TestClient

    from agentrl.viewer.server import create_app

    t0 = time.perf_counter()
    with TestClient(create_app(run_dir)) as client:
        client.get("/").raise_for_status()
        client.get("/api/run").raise_for_status()
        page = client.get("/api/groups", params={"page": 0, "size": 20})
        page.raise_for_status()
        elapsed = time.perf_counter() - t0
        return elapsed, page.json()


def run(args: argparse.Namespace) -> int:
    tmp = None
    run_dir = args.run_dir
    if run_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="agentrl-view-bench-")
        run_dir = tmp.name
    try:
        t0 = time.perf_counter()
        synthetic_run(run_dir, episodes=args.episodes, n=args.n, groups_per_step=args.groups_per_step,
                      response_tokens=args.response_tokens, seed=args.seed)
        size_mb = (Path(run_dir) / "episodes.jsonl").stat().st_size / 2**20
        print(f"wrote {args.episodes} episodes ({size_mb:.0f} MiB episodes.jsonl) in {time.perf_counter() - t0:.1f} s")
        elapsed, page = first_page_s(run_dir)
        print(f"first page: {elapsed:.3f} s ({len(page['groups'])} groups shown, "
              f"{'still indexing' if page['indexing'] else 'index complete'})")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


__all__ = ["add_arguments", "first_page_s", "run", "synthetic_run"]
