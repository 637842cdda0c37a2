"""Steps per hour of `trainer.mode: async` against sync mode, side by side in one run, printed as ratios.

    agentrl bench async                          # 8 prompts x 8 episodes, 300 ms tools, k = 0 1 2 4
    agentrl bench async --long-tail              # 1 tool call in 10 takes 3 s
    agentrl bench async --quick                  # a few small steps: checks the bench end to end in minutes
    agentrl bench async --model runs/quickstart/sft --json async.json

Every side is a real `agentrl train` run (a subprocess, its own temp run dir) with the same model (default: the
offline tiny model, built once in a temp dir), the same generated calc tasks (`agentrl data make calc`), the same
budget (`--steps` steps of `--prompts` prompts x `--n` episodes, up to 4 assistant turns), the same engine threads
(`--engine-threads`, default 1 as in the quickstart), the same `--set` overrides (`--async-set`: the async sides
only) and the same seed: sync
first, then async at each `--staleness` k (`trainer.max_staleness`), every async side with token-level TIS
(`algorithm.rollout_correction.level=token`), the off-policy correction async mode requires.

The calculator is served by a tool service this bench starts on a free loopback port, fresh for each side, whose
calls wait `--tool-latency-ms` before answering; with `--long-tail` call i (counted from 0 within a side) waits
3 s instead when a generator seeded with (`--seed`, i) draws below 0.1, so every side sees the same latency at the
same call index. A random tiny model rarely writes a well-formed tool call: the table's `tools/ep` column says how
many calls an episode made, so a run whose tool latency never came into play says so; `--model` takes a model that
calls its tools (the quickstart's SFT model).

Columns, from each run's metrics.jsonl: wall s is the sum of `timing/step_s` (the trainer's steps, start-up
excluded); steps/hour = steps / wall; ratio = this side's steps/hour over sync's; trainer idle = the trainer
waiting for data over wall (async: `async/trainer_wait_s`; sync: `timing/rollout_s`, the rollout it waits on);
engine idle = rollout side waiting for weights over wall (async: `async/engine_wait_s`; sync: wall minus
`timing/rollout_s`); dropped = `data/stale_groups_dropped`; staleness = the mean of `rollout/staleness_mean`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agentrl.tools.base import tool
from agentrl.tools.builtin.calculator import evaluate, format_result

LONG_TAIL_S = 3.0
LONG_TAIL_RATE = 0.1
LATENCY_ENV = "AGENTRL_BENCH_TOOL_LATENCY_MS"
LONG_TAIL_ENV = "AGENTRL_BENCH_LONG_TAIL_SEED"  # unset: no long tail
QUICK = {"steps": 3, "prompts": 2, "n": 4, "max_new_tokens": 32}
_calls = itertools.count()


def call_latency_s(index: int, latency_ms: float, long_tail_seed: int | None) -> float:
    """Seconds call `index` of a side waits: `latency_ms`, or 3 s for the seeded 1 call in 10 with a long tail."""
    if long_tail_seed is not None and random.Random(f"{long_tail_seed}-{index}").random() < LONG_TAIL_RATE:
        return LONG_TAIL_S
    return latency_ms / 1000


@tool
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "(3 + 4) * 12"; also // % ** sqrt log abs round min max pi e
    """
    seed = os.environ.get(LONG_TAIL_ENV)
    await asyncio.sleep(call_latency_s(next(_calls), float(os.environ.get(LATENCY_ENV, "0")),
                                       None if seed is None else int(seed)))
    return format_result(evaluate(expression))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=8, help="trainer steps per side (default 8)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--n", type=int, default=8, help="episodes per prompt (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per assistant turn (default 64)")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4], metavar="K",
                        help="trainer.max_staleness of the async sides (default 0 1 2 4)")
    parser.add_argument("--tool-latency-ms", type=float, default=300.0, help="every tool call's latency (default 300)")
    parser.add_argument("--long-tail", action="store_true", help="1 tool call in 10 (seeded) takes 3 s instead")
    parser.add_argument("--quick", action="store_true",
                        help="a small budget for a test: --steps 3 --prompts 2 --n 4 --max-new-tokens 32")
    parser.add_argument("--model", default=None, help="HF model dir (default: build the tiny model in a temp dir)")
    parser.add_argument("--engine-threads", type=int, default=1,
                        help="engine.num_threads on every side (default 1, as the quickstart: the engine shares the "
                             "cores with the trainer's rank)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="train-config overrides for every side, e.g. actor.num_threads_per_worker=1")
    parser.add_argument("--async-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="train-config overrides for the async sides only, after --set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the table's rows to OUT as JSON")
    parser.add_argument("--keep", default=None, help="keep the run directories under this path")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one side's run may take (default 3600)")


def side_config(args: argparse.Namespace, model: Path, tasks: Path, run_dir: Path, tool_url: str,
                staleness: int | None):
    """The training config of one side: sync when `staleness` is None, else async at that max_staleness."""
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig

    episodes = args.prompts * args.n
    data = {
        "model": {"path": str(model), "dtype": "float32", "gradient_checkpointing": False},
        "data": {"train_files": [str(tasks)], "train_batch_size": args.prompts, "shuffle": False},
        "engine": {"backend": "local", "dtype": "float32", "max_batch_size": episodes,
                   "num_threads": args.engine_threads},
        "tools": {"services": [{"name": "slow-calculator", "url": tool_url, "tools": ["calculator"],
                                "timeout_s": 60, "max_concurrency": episodes}]},
        "agent": {"max_assistant_turns": 4, "max_new_tokens_per_turn": args.max_new_tokens,
                  "max_response_tokens": 4 * args.max_new_tokens + 128, "max_tool_response_tokens": 64},
        "rollout": {"n": args.n, "temperature": 1.0, "seed": args.seed, "max_concurrent_episodes": episodes},
        "reward": {"answer_from": "answer_tag"},
        "actor": {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 0, "lr_schedule": "constant", "grad_clip": 1.0,
                  "ppo_mini_batch_size": args.prompts, "ppo_epochs": 1, "use_kl_loss": False,
                  "max_tokens_per_micro_batch": 8192, "world_size": 1},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"total_steps": args.steps, "run_dir": str(run_dir), "test_freq": 0, "save_freq": 0,
                    "resume": "never", "seed": args.seed, "loggers": ["jsonl"], "save_hf_model": False},
    }
    overrides = list(args.set)
    if staleness is not None:
        data["trainer"].update(mode="async", max_staleness=staleness)
        data["algorithm"]["rollout_correction"] = {"level": "token"}
        overrides += args.async_set
    return load_config(TrainConfig, data=data, overrides=overrides)


def run_side(args: argparse.Namespace, model: Path, tasks: Path, run_dir: Path,
             staleness: int | None) -> list[dict]:
    """One side's per-step metrics, from a fresh `agentrl train` run against a fresh slow tool service."""
    from agentrl.config import save_config
    from agentrl.services import agentrl_command, free_port, run_service

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {LATENCY_ENV: str(args.tool_latency_ms)}
    if args.long_tail:
        env[LONG_TAIL_ENV] = str(args.seed)
    spec = save_config(side_config(args, model, tasks, run_dir, url, staleness), run_dir.parent,
                       f"{run_dir.name}.yaml")
    with run_service(agentrl_command("tools", "serve", "agentrl.trainer.async_bench:calculator", "--port", str(port)),
                     f"{url}/health", name="the bench's slow tool service", env=env):
        try:
            proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", str(spec)], capture_output=True,
                                  text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"agentrl train ({run_dir.name}) did not finish within {args.timeout} s "
                               "(--timeout)") from None
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl train ({run_dir.name}) failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing/step_s" in r]


def summarize(mode: str, k: int | None, steps: list[dict]) -> dict:
    """One table row from a side's per-step metrics (see the module docstring for each column)."""
    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in steps)

    wall = total("timing/step_s")
    if mode == "sync":
        trainer_idle, engine_idle = total("timing/rollout_s"), wall - total("timing/rollout_s")
    else:
        trainer_idle, engine_idle = total("async/trainer_wait_s"), total("async/engine_wait_s")
    staleness = [r["rollout/staleness_mean"] for r in steps if "rollout/staleness_mean" in r]
    tools = [r["rollout/tool_calls_per_episode"] for r in steps if "rollout/tool_calls_per_episode" in r]
    return {"mode": mode, "k": k, "steps": len(steps), "wall_s": wall,
            "steps_per_hour": 3600 * len(steps) / wall if wall > 0 else 0.0,
            "trainer_idle": trainer_idle / wall if wall > 0 else 0.0,
            "engine_idle": engine_idle / wall if wall > 0 else 0.0,
            "stale_groups_dropped": int(total("data/stale_groups_dropped")),
            "staleness_mean": statistics.fmean(staleness) if staleness else None,
            "tool_calls_per_episode": statistics.fmean(tools) if tools else 0.0}


def format_table(rows: list[dict]) -> str:
    """The side-by-side table; `ratio` is each row's steps/hour over the sync row's."""
    sync = next(r for r in rows if r["mode"] == "sync")
    lines = [f"{'mode':<7}{'k':>3}{'steps':>7}{'wall s':>9}{'steps/hour':>12}{'ratio':>8}{'trainer idle':>14}"
             f"{'engine idle':>13}{'dropped':>9}{'staleness':>11}{'tools/ep':>10}"]
    for r in rows:
        ratio = r["steps_per_hour"] / sync["steps_per_hour"] if sync["steps_per_hour"] else float("nan")
        staleness = "-" if r["staleness_mean"] is None else f"{r['staleness_mean']:.2f}"
        lines.append(f"{r['mode']:<7}{'-' if r['k'] is None else r['k']:>3}{r['steps']:>7}{r['wall_s']:>9.1f}"
                     f"{r['steps_per_hour']:>12.0f}{ratio:>7.2f}x{r['trainer_idle']:>14.2f}{r['engine_idle']:>13.2f}"
                     f"{r['stale_groups_dropped']:>9}{staleness:>11}{r['tool_calls_per_episode']:>10.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    keep = Path(args.keep) if args.keep else None
    with contextlib.ExitStack() as stack:
        root = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentrl-bench-async-")))
        root.mkdir(parents=True, exist_ok=True)
        if args.model:
            model = Path(args.model)
        else:
            from agentrl.models.tiny import build_tiny_model

            model = Path(build_tiny_model(root / "model", seed=args.seed))
        from agentrl.data.suites.calc import make_tasks

        tasks = root / "tasks.jsonl"
        rows = make_tasks("train", args.steps * args.prompts * 2, seed=args.seed)
        tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
        tail = f", 1 call in 10 takes {LONG_TAIL_S:g} s" if args.long_tail else ""
        print(f"{args.steps} steps of {args.prompts} prompts x {args.n} episodes, up to 4 turns of "
              f"{args.max_new_tokens} tokens, tool calls take {args.tool_latency_ms:g} ms{tail}; model {model}; "
              f"{os.cpu_count()} CPUs", flush=True)
        sides: list[tuple[str, int | None]] = [("sync", None)] + [("async", k) for k in args.staleness]
        table = []
        for mode, k in sides:
            name = mode if k is None else f"async-k{k}"
            run_dir = root / name
            shutil.rmtree(run_dir, ignore_errors=True)
            table.append(summarize(mode, k, run_side(args, model, tasks, run_dir, k)))
            print(f"{name}: {table[-1]['wall_s']:.1f} s for {table[-1]['steps']} steps", flush=True)
    print()
    print(format_table(table))
    print("ratio: steps/hour over sync's, same model, tasks, seed and budget; idle: fraction of the wall time")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "func"},
                                               "rows": table}, indent=2) + "\n")
    return 0


__all__ = ["add_arguments", "call_latency_s", "calculator", "format_table", "run", "summarize"]
