"""Code-reward grading of a GRPO run's rollouts: every episode run in the sandbox vs each distinct program once.

    agentrl bench rewards --run runs/quickstart [--steps 4] [--concurrency 64] [--url http://...]

Reads the first `--steps` steps of RUN/grpo/episodes.jsonl (the rollouts as the run wrote them: final messages
and finish reasons) and their tasks (the RUN/data/*.jsonl rows with the same task_id), starts a sandbox service
(unless `--url`), and grades each step's episodes all at once, at most `--concurrency` in flight (a rollout's
`max_concurrent_episodes`), twice: with `reward.reuse_verdicts=false` (every episode runs its code) and with
verdicts reused (each distinct program once, in flight or done; a fresh cache for every step, so nothing carries
over from the other pass or an earlier step). The two passes alternate which goes first from step to step.
Prints sandbox runs, seconds and the wall-clock ratio per step and in total, and fails (exit 1) if any episode's
reward differs between the passes or from the reward the run recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from agentrl.data.tasks import read_tasks
from agentrl.types import Episode, Task


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="a quickstart or train run directory with grpo/episodes.jsonl "
                                                "and the task rows under data/")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps of the run to grade (the first ones)")
    p.add_argument("--concurrency", type=int, default=64, help="episodes graded at once (max_concurrent_episodes)")
    p.add_argument("--url", default=None, help="grade on a running sandbox service instead of starting one")


def load(run: Path, steps: int) -> tuple[list[list[dict]], dict[str, Task]]:
    """The episodes of the first `steps` steps (one list per step) and the task rows they name, by task_id."""
    episodes_file = run / "grpo" / "episodes.jsonl"
    if not episodes_file.is_file():
        raise FileNotFoundError(f"{episodes_file} not found: give --run a run directory whose GRPO phase wrote "
                                "its rollouts (rollout.dump_episodes: true)")
    by_step: dict[int, list[dict]] = defaultdict(list)
    with open(episodes_file) as f:
        for line in f:
            episode = json.loads(line)
            if episode["step"] <= steps:
                by_step[episode["step"]].append(episode)
    wanted = {e["task_id"] for step in by_step.values() for e in step}
    tasks: dict[str, Task] = {}
    for path in sorted((run / "data").rglob("*.jsonl")):
        for _, task in read_tasks(path):  # rows that are not tasks (SFT transcripts) come back as errors
            if isinstance(task, Task) and task.task_id in wanted:
                tasks[task.task_id] = task
    missing = wanted - tasks.keys()
    if missing:
        raise LookupError(f"{len(missing)} task(s) of the rollouts are not in {run / 'data'} "
                          f"(e.g. {sorted(missing)[0]!r}): give the run directory that holds its task files")
    return [by_step[s] for s in sorted(by_step)], tasks


async def grade(rows: list[dict], tasks: dict[str, Task], url: str, reuse: bool, concurrency: int):
    """(rewards, sandbox runs, seconds) of one step's episodes graded at once."""
    from agentrl.agent_loop import rewards
    from agentrl.agent_loop.config import RewardConfig

    rewards.VERDICTS = rewards.VerdictCache()  # a fresh cache: only this step's copies are reused
    config = RewardConfig(sandbox_url=url, reuse_verdicts=reuse)
    limit = asyncio.Semaphore(concurrency)

    async def one(row: dict) -> tuple[float, bool]:
        episode = Episode.from_dict(row)  # its recorded reward_info is replaced by this grading's
        async with limit:
            reward = await rewards.compute_reward(tasks[episode.task_id], episode, config)
        info = episode.metrics.get("reward_info", {})
        ran = info.get("kind") != "no_code" and not info.get("reused")
        return reward, ran

    start = time.perf_counter()
    results = await asyncio.gather(*[one(row) for row in rows])
    seconds = time.perf_counter() - start
    return [r for r, _ in results], sum(ran for _, ran in results), seconds


async def _bench(url: str, args: argparse.Namespace, steps: list[list[dict]], tasks: dict[str, Task]) -> int:
    print(f"{args.run}: {len(steps)} GRPO steps, {sum(map(len, steps))} episodes, graded at {args.concurrency} "
          f"at once on {url}")
    print(f"{'step':>4} {'episodes':>8} {'runs (all)':>10} {'runs (once)':>11} {'all s':>7} {'once s':>7} {'ratio':>6}")
    total = {"all": [0, 0.0], "once": [0, 0.0]}
    mismatches = 0
    await grade(steps[0][:8], tasks, url, False, args.concurrency)  # warm-up: imports, the first sandbox start
    for index, rows in enumerate(steps):
        order = (False, True) if index % 2 == 0 else (True, False)
        outcome = {}
        for reuse in order:
            outcome["once" if reuse else "all"] = await grade(rows, tasks, url, reuse, args.concurrency)
        recorded = [float(row["reward"]) for row in rows]
        mismatches += sum(a != b or a != c for a, b, c in zip(outcome["all"][0], outcome["once"][0], recorded))
        for key in total:
            total[key][0] += outcome[key][1]
            total[key][1] += outcome[key][2]
        (_, runs_all, s_all), (_, runs_once, s_once) = outcome["all"], outcome["once"]
        print(f"{rows[0]['step']:>4} {len(rows):>8} {runs_all:>10} {runs_once:>11} {s_all:>7.2f} {s_once:>7.2f} "
              f"{s_all / s_once:>5.2f}x")
    (runs_all, s_all), (runs_once, s_once) = total["all"], total["once"]
    print(f"total: {runs_all} -> {runs_once} sandbox runs ({runs_all / max(runs_once, 1):.2f}x fewer), "
          f"{s_all:.1f} s -> {s_once:.1f} s grading: {s_all / s_once:.2f}x faster with verdicts reused")
    if mismatches:
        print(f"FAIL: {mismatches} episode(s) scored differently between the passes or from the run's record",
              file=sys.stderr)
        return 1
    print("every episode's reward is the same in both passes and as the run recorded it")
    return 0


def run(args: argparse.Namespace) -> int:
    from agentrl.services import ServiceStartError, agentrl_command, free_port, run_service

    try:  # before the sandbox starts: a wrong run directory is one line
        steps, tasks = load(Path(args.run), args.steps)
    except (FileNotFoundError, LookupError) as e:
        print(f"agentrl bench rewards: {e}", file=sys.stderr)
        return 2
    if not steps:
        print(f"agentrl bench rewards: {args.run} has no rollouts in its first {args.steps} GRPO steps",
              file=sys.stderr)
        return 2
    if args.url:
        return asyncio.run(_bench(args.url.rstrip("/"), args, steps, tasks))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        with run_service(agentrl_command("sandbox", "serve", "--port", str(port)), f"{url}/health",
                         name="the sandbox service"):
            return asyncio.run(_bench(url, args, steps, tasks))
    except ServiceStartError as e:
        print(e, file=sys.stderr)
        return 1
