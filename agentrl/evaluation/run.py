"""Held-out evaluation of one model: roll out a task list n times, score it, write eval.json and eval.md.

    import asyncio
    from agentrl.evaluation.run import evaluate, suite_tasks
    tasks = suite_tasks("calc", split="heldout", num_tasks=200, out_dir="runs/eval-tiny")
    summary = asyncio.run(evaluate("runs/tiny-model", tasks, n=4, run_dir="runs/eval-tiny"))
    print(summary["pass@1"], summary["pass@4"])

`evaluate` takes an HF model directory or a training checkpoint (exported on first use:
`agentrl.trainer.export.resolve_model_dir`), builds the engine (`make_engine`) unless one is passed, runs the
same `RolloutManager` the trainer uses (so budgets, parsers, rewards and infra-failure handling are identical
to training), and summarises the episodes with `agentrl.evaluation.metrics.summarize`. Sampling: greedy
(temperature 0) by default when n == 1, temperature 1.0 when n > 1 (pass@k of n identical greedy samples would
just repeat pass@1, so that mix is refused). Progress: a bar on a terminal, else a plain line on stderr per
tenth of the episodes, with an ETA. The run directory receives:

- `eval.json`: {"name", "model", "tasks_source", "settings", "config", "summary", "infra_failures", "timing",
  "tasks": one row per task (rewards, successes, finish reasons, turns, the first sample's final answer)};
- `eval.md`: the Markdown summary (`agentrl.evaluation.report.markdown_report`) plus the settings used;
- `episodes.jsonl`: every episode (tokens, masks, transcript), rewritten on each evaluation into that dir.

Tools: `tools=None` serves the tasks' built-in tools in-process (calculator, lookup; python talks to the sandbox
at `reward_config.sandbox_url`, which also grades unit tests); pass a `ToolRegistry` (e.g.
`ToolRegistry.from_config("configs/tools/x.yaml")`) to call HTTP tool services instead.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.agent_loop.rewards import SANDBOX_REWARDS, final_text
from agentrl.agent_loop.rollout import EPISODES_FILE, RolloutManager
from agentrl.evaluation.metrics import summarize
from agentrl.evaluation.report import markdown_report
from agentrl.inference.config import EngineConfig
from agentrl.types import Episode, Task

EVAL_JSON = "eval.json"
EVAL_MD = "eval.md"
_ANSWER_CHARS = 300  # final answer kept per task in eval.json (the full transcript is in episodes.jsonl)


def default_ks(n: int) -> list[int]:
    """pass@k values reported by default: 1, the powers of two below n, and n."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    return sorted(set(ks + [n]))


def resolve_temperature(temperature: float | None, n: int) -> float:
    """None -> 0.0 (greedy) for n == 1, 1.0 for n > 1. Refuses greedy with n > 1."""
    if n < 1:
        raise ValueError(f"n (samples per task) must be >= 1, got {n}")
    if temperature is None:
        return 0.0 if n == 1 else 1.0
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and n > 1:
        raise ValueError(f"temperature 0 (greedy) with n={n} samples per task gives {n} identical samples, so "
                         "pass@k would only repeat pass@1; use n=1 for greedy, or temperature > 0 (e.g. 1.0)")
    return float(temperature)


def suite_tasks(spec: str, *, split: str = "heldout", num_tasks: int = 200, seed: int = 0,
                out_dir: str | Path | None = None) -> list[Task]:
    """Tasks from a task file (.jsonl/.parquet) or generated from suite names ("calc", "calc,lookup").

    Generated suites are seeded (same arguments, same tasks) and `num_tasks` is per suite. They are written to
    `out_dir/tasks.jsonl` (with the lookup knowledge base beside it, which the tasks' lookup tool reads), so a
    run directory holds exactly what was evaluated; `out_dir` is required for the lookup suite.
    """
    from agentrl.data.suites import SUITES, make_suite
    from agentrl.data.suites.common import write_jsonl
    from agentrl.data.tasks import load_tasks, task_from_row

    path = Path(spec)
    if path.suffix in (".jsonl", ".json", ".parquet") or path.is_file():
        return load_tasks(path)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES]
    if not names or unknown:
        raise ValueError(f"--suite {spec!r}: {unknown or spec!r} is neither a task file (.jsonl/.parquet) nor a "
                         f"suite name; suites: {', '.join(SUITES)} (comma-separate several)")
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    out = Path(out_dir) if out_dir is not None else None
    if out is None and "lookup" in names:
        raise ValueError("the lookup suite writes a knowledge base its tasks read: pass out_dir")
    rows: list[dict] = []
    for name in names:
        kb_path = (out / f"{name}-{split}.kb.jsonl").resolve() if out is not None else None
        suite_rows, kb_rows = make_suite(name, split, num_tasks, seed, kb_path=kb_path)
        if kb_rows is not None:
            kb_path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(kb_path, kb_rows)
        rows += suite_rows
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(out / "tasks.jsonl", rows)
    return [task_from_row(row, where=f"suite {row['data_source']} row {i}") for i, row in enumerate(rows, 1)]


def default_tools(tasks: list[Task], *, sandbox_url: str | None = None, sandbox_token_file: str | None = None):
    """An in-process `ToolRegistry` with the built-in tools the tasks name (None when no task names a tool).

    calculator and lookup run entirely in this process; python runs its code in the sandbox at `sandbox_url`
    (with the token in `sandbox_token_file`, if the sandbox has one).
    """
    from agentrl.tools.client import ToolRegistry
    from agentrl.tools.config import BUILTIN_TOOLS, ToolsConfig

    if any(task.tools is None for task in tasks):
        raise ValueError("some tasks allow every tool (tools: null), so the tool set cannot be inferred; pass "
                         "tools=ToolRegistry.from_config(...) (CLI: --tools-config FILE)")
    names = sorted({name for task in tasks for name in (task.tools or [])})
    if not names:
        return None
    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise ValueError(f"the tasks use tool(s) {unknown} that are not built in ({', '.join(BUILTIN_TOOLS)}); "
                         "pass tools=ToolRegistry.from_config(...) (CLI: --tools-config FILE)")
    kwargs = builtin_tools_kwargs(names, sandbox_url, sandbox_token_file)
    return ToolRegistry.from_tools_config(ToolsConfig(builtin=names, tools_kwargs=kwargs))


def builtin_tools_kwargs(names: list[str], sandbox_url: str | None,
                         sandbox_token_file: str | None = None) -> dict[str, dict]:
    """Session defaults the built-in tools need: the python tool's sandbox (required when python is used)."""
    if "python" not in names:
        return {}
    if not sandbox_url:
        raise ValueError("the python tool runs code in the sandbox: start one (`agentrl sandbox serve --port 8080`) "
                         "and set reward_config.sandbox_url (CLI: --sandbox-url http://127.0.0.1:8080)")
    token = {"sandbox_token_file": sandbox_token_file} if sandbox_token_file else {}
    return {"python": {"sandbox_url": sandbox_url, **token}}


async def evaluate(model_path: str | Path, tasks: list[Task], *, n: int = 1, ks: Iterable[int] | None = None,
                   temperature: float | None = None, top_p: float = 1.0, top_k: int = -1, seed: int | None = 0,
                   engine_config: EngineConfig | None = None, agent_config: AgentLoopConfig | None = None,
                   reward_config: RewardConfig | None = None, tools=None, max_concurrent_episodes: int = 64,
                   success_threshold: float = 1.0, run_dir: str | Path | None = None, name: str | None = None,
                   engine=None, tasks_source: str = "") -> dict:
    """Roll out every task `n` times with `model_path` (an HF model directory or a training checkpoint) and
    return the summary (`metrics.summarize`).

    - `ks`: pass@k values (default `default_ks(n)`); `temperature`: None picks greedy for n == 1, else 1.0;
      `seed`: base sampling seed (None: unseeded); `success_threshold`: reward that counts as solved.
    - `engine_config`/`agent_config`/`reward_config`: as in training (defaults: the dataclass defaults).
    - `tools`: a `ToolRegistry` (not closed here) or None for the tasks' in-process built-ins (`default_tools`).
    - `engine`: an already running engine to use (not closed here), e.g. the trainer's; `model_path` then only
      provides the tokenizer and the label.
    - `run_dir`: where eval.json, eval.md and episodes.jsonl go (nothing is written when None).
    Infra-failed episodes (tool/engine faults, timeouts) are excluded from the success statistics and reported.
    """
    temperature = resolve_temperature(temperature, n)
    ks = sorted(set(default_ks(n) if ks is None else ks))
    if not ks or ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"every k of pass@k must be in 1..n={n}, got {ks}")
    if not tasks:
        raise ValueError("no tasks to evaluate")
    from agentrl.console import progress, quiet_third_party
    from agentrl.trainer.export import resolve_model_dir

    quiet_third_party()
    if engine is None:  # a checkpoint is exported to a model directory the engine can load
        model_path = resolve_model_dir(model_path)
    name = name or model_label(model_path)
    engine_config = engine_config or EngineConfig()
    agent_config = agent_config or AgentLoopConfig()
    reward_config = reward_config or RewardConfig()
    code_kinds = sorted({t.reward.get("type") for t in tasks} & SANDBOX_REWARDS)
    if reward_config.sandbox_url is None and code_kinds:
        # otherwise every episode would fail in its grader and be reported as an infra failure
        raise ValueError(f"the tasks have {'/'.join(code_kinds)} rewards, which run in the sandbox: set "
                         "reward_config.sandbox_url "
                         "(CLI: --sandbox-url http://127.0.0.1:PORT, after `agentrl sandbox serve`)")
    sampling = RolloutConfig(n=n, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                             max_concurrent_episodes=max_concurrent_episodes, dump_episodes=run_dir is not None)
    out = Path(run_dir) if run_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / EPISODES_FILE).unlink(missing_ok=True)  # RolloutManager appends; one evaluation per directory

    own_tools = tools is None
    registry = default_tools(tasks, sandbox_url=reward_config.sandbox_url,
                             sandbox_token_file=reward_config.sandbox_token_file) if own_tools else tools
    own_engine = engine is None
    t_start = time.monotonic()
    try:
        if registry is not None:
            await registry.start()  # discovers remote tools; RolloutManager checks task tool names against them
        if own_engine:
            from agentrl.inference import make_engine

            engine = make_engine(engine_config, str(model_path))
        tokenizer = _tokenizer(engine, model_path)
        t_ready = time.monotonic()
        manager = RolloutManager(engine, tokenizer, registry, agent_config, sampling, reward_config, run_dir=out)
        episodes = await manager.generate(tasks, n=n, progress=progress(len(tasks) * n, f"eval {name}"))
        t_done = time.monotonic()
    finally:
        if own_engine and engine is not None and hasattr(engine, "close"):
            await engine.close()
        if own_tools and registry is not None:
            await registry.aclose()

    summary = summarize(episodes, ks=ks, success_threshold=success_threshold)
    model_tokens = sum(sum(e.response_mask) for e in episodes)
    record = {
        "name": name,
        "model": str(Path(model_path).resolve() if Path(model_path).exists() else model_path),  # from any dir
        "tasks_source": tasks_source,
        "settings": {"n": n, "ks": ks, "temperature": temperature, "greedy": temperature == 0.0, "top_p": top_p,
                     "top_k": top_k, "seed": seed, "success_threshold": success_threshold,
                     "max_concurrent_episodes": max_concurrent_episodes},
        "config": {"engine": engine_config.model_dump(), "agent": agent_config.model_dump(),
                   "reward": reward_config.model_dump(), "tools": _tools_info(registry)},
        "summary": summary,
        "infra_failures": infra_failures(episodes),
        "timing": {"startup_s": t_ready - t_start, "rollout_s": t_done - t_ready, "total_s": t_done - t_start,
                   "episodes_per_s": len(episodes) / max(t_done - t_ready, 1e-9),
                   "model_tokens_per_s": model_tokens / max(t_done - t_ready, 1e-9)},
        "tasks": task_results(tasks, episodes, n=n, success_threshold=success_threshold),
    }
    if out is not None:
        (out / EVAL_JSON).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        (out / EVAL_MD).write_text(eval_markdown(record))
    return summary


def _tokenizer(engine, model_path: str | Path):
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


def _tools_info(registry) -> dict:
    if registry is None:
        return {"names": [], "served_by": {}}
    return {"names": registry.names(), "served_by": {n: registry.service_of(n) for n in registry.names()}}


def model_label(model_path: str | Path) -> str:
    """A short column name for a model: its directory name (with the parent's when that is generic)."""
    p = Path(model_path).resolve()
    if p.name in ("model", "actor", "hf", "huggingface") or p.name.startswith(("step", "global_step", "checkpoint")):
        return f"{p.parent.name}/{p.name}"
    return p.name


def task_results(tasks: list[Task], episodes: list[Episode], *, n: int, success_threshold: float) -> list[dict]:
    """One row per task: rewards and outcomes of its n samples (episodes come in task order, then sample)."""
    if len(episodes) != len(tasks) * n:
        raise ValueError(f"expected {len(tasks)} tasks x {n} samples = {len(tasks) * n} episodes, got {len(episodes)}")
    rows = []
    for i, task in enumerate(tasks):
        group = episodes[i * n:(i + 1) * n]
        valid = [e for e in group if not e.infra_error]
        rows.append({
            "task_id": task.task_id or f"task{i}",
            "data_source": task.data_source,
            "ground_truth": task.reward.get("ground_truth"),
            "rewards": [e.reward for e in group],
            "valid": len(valid),
            "correct": sum(e.reward >= success_threshold for e in valid),
            "finish_reasons": [e.finish_reason for e in group],
            "num_turns": [e.num_turns for e in group],
            "tool_calls": [len(e.tool_calls) for e in group],
            "answer": final_text(group[0])[-_ANSWER_CHARS:],
        })
    return rows


def infra_failures(episodes: list[Episode]) -> dict:
    """Counts of infra-failed episodes by cause (metrics["stop_detail"] / reward_error) and a few examples."""
    by_cause: dict[str, int] = {}
    examples = []
    for e in episodes:
        if not e.infra_error:
            continue
        cause = "reward_error" if "reward_error" in e.metrics else str(e.metrics.get("stop_detail", e.finish_reason))
        by_cause[cause] = by_cause.get(cause, 0) + 1
        if len(examples) < 10:
            detail = e.metrics.get("reward_error") or e.metrics.get("infra_detail") or cause
            examples.append({"task_id": e.task_id, "cause": cause, "detail": str(detail)[:500]})
    return {"count": sum(by_cause.values()), "by_cause": dict(sorted(by_cause.items())), "examples": examples}


def _settings_lines(record: dict) -> list[str]:
    s, t = record["settings"], record["timing"]
    sampling = "greedy" if s["greedy"] else f"temperature {s['temperature']}, top_p {s['top_p']}, top_k {s['top_k']}"
    lines = [f"- model: `{record['model']}`",
             f"- tasks: {record['summary']['num_tasks']} from {record['tasks_source'] or 'a task list'}, "
             f"n = {s['n']} samples each ({sampling}, seed {s['seed']})",
             f"- success: reward >= {s['success_threshold']}; pass@k unbiased over k in {s['ks']}",
             f"- time: {t['total_s']:.1f} s ({t['episodes_per_s']:.2f} episodes/s, "
             f"{t['model_tokens_per_s']:.0f} model tokens/s)"]
    infra = record["infra_failures"]
    if infra["count"]:
        causes = ", ".join(f"{k} {v}" for k, v in infra["by_cause"].items())
        lines.append(f"- infra-failed episodes (excluded from success rates): {infra['count']} ({causes})")
    return lines


def eval_markdown(record: dict) -> str:
    """eval.md: the report table(s) for one model, then the settings that produced them."""
    body = markdown_report(f"Evaluation: {record['name']}", {record["name"]: record["summary"]})
    return body + "\n## Settings\n\n" + "\n".join(_settings_lines(record)) + "\n"


def compare_markdown(records: list[dict]) -> str:
    """Two (or more) eval.json records side by side, with paired per-task wins when they share tasks."""
    names = unique_names([r["name"] for r in records])
    body = markdown_report("Evaluation: " + " vs ".join(names), dict(zip(names, (r["summary"] for r in records))))
    parts = [body]
    if len(records) == 2:
        parts.append(_paired(names, records))
    differ = [key for key in ("n", "temperature", "top_p", "top_k", "success_threshold")
              if len({json.dumps(r["settings"][key]) for r in records}) > 1]
    if differ:
        parts.append("**Warning:** the runs used different settings: " + "; ".join(
            f"{k}: " + " vs ".join(str(r["settings"][k]) for r in records) for k in differ) + "\n")
    for name, record in zip(names, records):
        parts.append(f"## {name}\n\n" + "\n".join(_settings_lines(record)) + "\n")
    return "\n".join(parts)


def _paired(names: list[str], records: list[dict]) -> str:
    a, b = ({t["task_id"]: t for t in r["tasks"]} for r in records)
    common = [tid for tid in a if tid in b and a[tid]["valid"] and b[tid]["valid"]]
    if not common:
        return "**Warning:** the two runs share no task ids, so no per-task comparison is possible.\n"

    def rate(row: dict) -> float:
        return row["correct"] / row["valid"]

    wins_a = sum(rate(a[t]) > rate(b[t]) for t in common)
    wins_b = sum(rate(a[t]) < rate(b[t]) for t in common)
    line = (f"Per task ({len(common)} tasks valid in both): {names[0]} better on {wins_a}, {names[1]} better on "
            f"{wins_b}, tied on {len(common) - wins_a - wins_b}.")
    if len(common) < max(len(a), len(b)):
        line += f" Only shared tasks are compared ({len(a)} vs {len(b)} tasks in the runs)."
    return line + "\n"


def unique_names(names: list[str]) -> list[str]:
    """Column names, made distinct with a suffix when two runs carry the same name."""
    out: list[str] = []
    for name in names:
        candidate, i = name, 2
        while candidate in out:
            candidate, i = f"{name} ({i})", i + 1
        out.append(candidate)
    return out


def load_eval(run_dir: str | Path) -> dict:
    """The eval.json record of a finished evaluation (a run directory or the file itself)."""
    p = Path(run_dir)
    p = p / EVAL_JSON if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist: run `agentrl eval --model MODEL --suite ... --out DIR` first")
    return json.loads(p.read_text())


__all__ = ["evaluate", "suite_tasks", "default_tools", "builtin_tools_kwargs", "default_ks", "resolve_temperature",
           "task_results", "infra_failures", "eval_markdown", "compare_markdown", "unique_names", "load_eval",
           "model_label", "EVAL_JSON", "EVAL_MD"]
