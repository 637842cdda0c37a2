"""Procedural task suites (calc, lookup, code; guess, a game played against an environment) with train and
held-out splits, and their scripted solvers.

    from agentrl.data.suites import make_suite, write_suite
    tasks, kb_rows = make_suite("lookup", "heldout", n=200, seed=0, kb_path="data/lookup-heldout.kb.jsonl")
    paths = write_suite("calc", "train", 1000, "data/calc-train.jsonl", seed=0)

Rows follow the project's task format (agentrl/data/tasks.py): prompt (system + user), tools, reward,
data_source ("<suite>/<split>"), tools_kwargs, task_id (a content hash: stable across runs and files) and
`extra` (the generator's own facts about the task: expression, hop chain, reference solution), which the
scripted solvers in `demos.py` use. Each suite's module docstring says how its splits differ.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.data.suites import calc, code, guess, lookup
from agentrl.data.suites.common import SPLITS, SuiteError, check_hard, check_split, write_jsonl

SUITES = ("calc", "lookup", "code", "guess")
SUITE_TOOLS = {"calc": calc.TOOLS, "lookup": lookup.TOOLS, "code": code.TOOLS, "guess": guess.TOOLS}
HARD_MIX_SUITES = ("calc", "lookup", "code")  # suites whose train split has a hard mix (make_suite(..., hard=True))


def check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise SuiteError(f"unknown suite {suite!r}; choose one of {list(SUITES)}")


def default_kb_path(out: str | Path) -> Path:
    """OUT.jsonl -> OUT.kb.jsonl, beside the task file."""
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(stem + ".kb.jsonl")


def make_suite(suite: str, split: str, n: int, seed: int = 0, *, kb_path: str | Path | None = None,
               hard: bool = False, calc_op_weights: tuple[float, ...] | None = None,
               ) -> tuple[list[dict], list[dict] | None]:
    """(task rows, KB rows or None). `kb_path` is required for "lookup": the tasks point their tool at it.
    `hard`: the train split's hard mix (more multi-step problems, train names and number ranges).
    `calc_op_weights`: calc's 1/2/3-operation shares instead of the split's (ignored by the other suites)."""
    check_suite(suite)
    check_split(split)
    if suite == "calc":
        return calc.make_tasks(split, n, seed, hard=hard, op_weights=calc_op_weights), None
    if suite == "code":
        return code.make_tasks(split, n, seed, hard=hard), None
    if suite == "guess":
        if hard:
            check_hard(suite, split)
            raise SuiteError("guess has no hard mix; drop --hard")
        return guess.make_tasks(split, n, seed), None
    if kb_path is None:
        raise ValueError("the lookup suite needs kb_path: the file its tasks' lookup tool will read")
    tasks, kb = lookup.make_tasks(split, n, seed, kb_path=str(kb_path), hard=hard)
    return tasks, kb.rows()


def write_suite(suite: str, split: str, n: int, out: str | Path, *, seed: int = 0,
                kb_path: str | Path | None = None, hard: bool = False) -> list[Path]:
    """Write `n` tasks to `out` (JSONL) and, for lookup, the KB (default OUT.kb.jsonl, referenced by absolute
    path from the tasks). Returns the paths written. Same arguments, same bytes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kb_file = Path(kb_path or default_kb_path(out)).resolve() if suite == "lookup" else None
    tasks, kb_rows = make_suite(suite, split, n, seed, kb_path=kb_file, hard=hard)
    write_jsonl(out, tasks)
    if kb_file is None:
        return [out]
    kb_file.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(kb_file, kb_rows)
    return [out, kb_file]


__all__ = ["HARD_MIX_SUITES", "SPLITS", "SUITES", "SUITE_TOOLS", "SuiteError", "default_kb_path", "make_suite",
           "write_suite"]
