"""Pieces every procedural suite shares: seeded generators, stable task ids, task rows and split partitions.

Determinism: a suite's generator is `random.Random(f"agentrl/{suite}/{split}/{seed}")`. Python seeds a Random
from a str through SHA-512, independent of PYTHONHASHSEED, so the same (suite, split, seed, n) gives the same
rows on every machine and Python version >= 3.2.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Callable

from agentrl.errors import UserError

SPLITS = ("train", "heldout")


class SuiteError(UserError, ValueError):
    """A suite was asked for something it cannot make (unknown suite or split, hard mix of held-out, too many)."""


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise SuiteError(f"unknown split {split!r}; choose one of {list(SPLITS)}")


def check_hard(suite: str, split: str) -> None:
    """The hard mix re-weights the *train* split (for RL); the held-out split has one fixed distribution."""
    if split != "train":
        raise SuiteError(f"{suite}: the hard mix (hard=True, --hard) re-weights the train split only, got split "
                         f"{split!r}; drop --hard, or use --split train")


def split_rng(suite: str, split: str, seed: int) -> random.Random:
    check_split(split)
    return random.Random(f"agentrl/{suite}/{split}/{seed}")


def stable_hash(text: str) -> int:
    """A 48-bit hash of `text` that is the same in every process (unlike `hash`)."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def heldout_only(name: str, every: int = 4) -> bool:
    """True for the names reserved for the held-out split (about 1 in `every`), whatever the seed.

    Both splits draw names from the same building blocks (so the tokens are familiar), but a whole name belongs to
    exactly one split: held-out questions are about entities the model never saw in training.
    """
    return stable_hash(name) % every == 0


def name_in_split(name: str, split: str) -> bool:
    check_split(split)
    return heldout_only(name) == (split == "heldout")


def task_id(suite: str, split: str, prompt: list[dict]) -> str:
    """A content id: the same question gets the same id in every file, and two questions never share one."""
    digest = hashlib.sha256(json.dumps(prompt, sort_keys=True).encode("utf-8")).hexdigest()[:12]
    return f"{suite}-{split}-{digest}"


def task_row(suite: str, split: str, *, system: str, user: str, tools: list[str], reward: dict,
             tools_kwargs: dict | None = None, extra: dict | None = None) -> dict[str, Any]:
    """One task in the project's JSONL row format (see agentrl/data/tasks.py and docs of the suites)."""
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {
        "prompt": prompt,
        "tools": list(tools),
        "reward": reward,
        "data_source": f"{suite}/{split}",
        "tools_kwargs": tools_kwargs or {},
        "task_id": task_id(suite, split, prompt),
        "extra": extra or {},
    }


def unique_rows(n: int, make_one: Callable[[], dict], *, what: str) -> list[dict]:
    """Call `make_one` until `n` rows with distinct task ids exist; fail clearly if the space is too small."""
    if n < 0:
        raise SuiteError(f"{what}: n must be >= 0, got {n}")
    rows: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    max_attempts = 50 * n + 1000
    while len(rows) < n:
        attempts += 1
        if attempts > max_attempts:
            raise SuiteError(f"{what}: only {len(rows)} distinct tasks after {max_attempts} draws, {n} asked; "
                             "ask for fewer tasks or widen the suite's ranges")
        row = make_one()
        if row["task_id"] not in seen:
            seen.add(row["task_id"])
            rows.append(row)
    return rows


def write_jsonl(path, rows: list[dict]) -> None:
    """Write rows as compact JSON lines with sorted keys, so equal rows give equal bytes."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
