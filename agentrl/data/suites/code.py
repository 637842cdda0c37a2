"""`code`: small function-writing tasks checked by unit tests in the sandbox; the `python` tool may test drafts.

A task describes a function over a list of integers as a numbered pipeline in words ("(1) keeps the even
numbers, then (2) multiplies each number by 4, and returns their sum") plus one worked example. Each phrase maps
to one line; with `comments` the reference restates each phrase, number included, above its line:

    def sum_values(xs):
        # (1) keeps the even numbers
        xs = [x for x in xs if x%2==0]
        # (2) multiplies each number by 4
        xs = [x * 4 for x in xs]
        # returns their sum
        return sum(xs)

What a small model must learn: copy the function name, emit one line per phrase with the phrase's constant
copied in, end with the reducer's `return`; optionally run the draft on the example with the `python` tool and
compare with the expected value; give the final code in a ```python block (the unit-test reward reads the last
one). The unit tests (the example, an empty list and three random lists) are computed with reference functions
written separately from the code lines, so a wrong line template would fail the suite's own tests.

The numbers and the comments are there for a model trained from scratch on a few thousand demonstrations. A
comment puts each phrase's words a few tokens before the operator they decide (`<` or `>`, `0` or `1`, `+` or
`*`): without them the cold start left one or two of those decisions unlearnt on each seed, and GRPO flipped them
for every phrase at once. The number makes the next step a copy (the words after `(3)` in the prompt) instead of a
search for the phrase after the last one written. The filter lines are written without spaces (`x>5`, the
template of the runs of 2026-12-05 at 51deeb7). docs/log.md has the runs.

Splits differ in distribution, not only seed:
- pipeline length: train has 0-3 steps before the reducer (0/1/2/3: 20/40/38/2%), held-out 1-3 (20/40/40%), so
  three-step pipelines are twenty times as common in held-out: the cold start writes most of them with two steps,
  and GRPO, on the hard mix below, learns the third;
- function names: `verb_noun` names, each name reserved for exactly one split (`common.name_in_split`), so the
  model must copy a name it never saw rather than recall one.

The train split's *hard mix* (`hard=True`, what the quickstart gives GRPO) keeps the train names but draws
1/2/3-step pipelines 15/35/50%: GRPO is where the model practises writing one line per phrase beyond two. Every
step of a hard-mix task changes the answer on its unit tests (`every_step_matters`; a draw where dropping a step
still passes them is redrawn at the same length): RL rewards no program that skips a line ("sorts the numbers"
before "their sum"), which GRPO had learnt to do and carried over to pipelines where the line matters. Held-out
names stay unseen by both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from agentrl.data.suites.common import check_hard, name_in_split, split_rng, task_row, unique_rows

NAME = "code"
TOOLS = ["python"]
SYSTEM = "Write the Python function. You may test it with the python tool. Give the final code in a ```python block."

VERBS = ["count", "sum", "pick", "scan", "mix", "fold", "sift", "tally", "crunch", "shape", "weigh", "grade"]
NOUNS = ["values", "items", "nums", "data", "scores", "points", "marks", "ticks", "coins", "steps"]

STEP_COUNTS = {"train": ((0, 1, 2, 3), (0.2, 0.4, 0.38, 0.02)), "heldout": ((1, 2, 3), (0.2, 0.4, 0.4))}
HARD_STEP_COUNTS = ((1, 2, 3), (0.15, 0.35, 0.5))  # the train split's hard mix (RL tasks)


@dataclass(frozen=True)
class Step:
    kind: str
    phrase: str
    line: str  # the body line, indented by the caller
    apply: Callable[[list[int]], Any]  # reference semantics, written independently of `line`


def _transform(kind: str, rng: random.Random) -> Step:
    k = rng.randint(2, 9) if kind == "mul" else rng.randint(1, 20)
    if kind == "gt":
        return Step(kind, f"keeps the numbers greater than {k}", f"xs = [x for x in xs if x>{k}]",
                    lambda xs: list(filter(lambda v: v > k, xs)))
    if kind == "lt":
        return Step(kind, f"keeps the numbers less than {k}", f"xs = [x for x in xs if x<{k}]",
                    lambda xs: list(filter(lambda v: v < k, xs)))
    if kind == "even":
        return Step(kind, "keeps the even numbers", "xs = [x for x in xs if x%2==0]",
                    lambda xs: list(filter(lambda v: not v & 1, xs)))
    if kind == "odd":
        return Step(kind, "keeps the odd numbers", "xs = [x for x in xs if x%2==1]",
                    lambda xs: list(filter(lambda v: v & 1, xs)))
    if kind == "add":
        return Step(kind, f"adds {k} to each number", f"xs = [x + {k} for x in xs]",
                    lambda xs: list(map(lambda v: v + k, xs)))
    if kind == "sub":
        return Step(kind, f"subtracts {k} from each number", f"xs = [x - {k} for x in xs]",
                    lambda xs: list(map(lambda v: v - k, xs)))
    if kind == "mul":
        return Step(kind, f"multiplies each number by {k}", f"xs = [x * {k} for x in xs]",
                    lambda xs: list(map(lambda v: v * k, xs)))
    if kind == "sort":
        return Step(kind, "sorts the numbers", "xs = sorted(xs)", lambda xs: sorted(xs))
    if kind == "reverse":
        return Step(kind, "reverses their order", "xs = xs[::-1]", lambda xs: list(reversed(xs)))
    raise ValueError(f"unknown code step kind {kind!r}")


TRANSFORMS = ["gt", "lt", "even", "odd", "add", "sub", "mul", "sort", "reverse"]
REDUCERS = [
    Step("sum", "their sum", "return sum(xs)", lambda xs: sum(xs)),
    Step("count", "how many there are", "return len(xs)", lambda xs: len(xs)),
    Step("max", "the largest one (0 if there is none)", "return max(xs, default=0)",
         lambda xs: sorted(xs)[-1] if xs else 0),
    Step("first", "the first one (-1 if there is none)", "return xs[0] if xs else -1",
         lambda xs: xs[0] if xs else -1),
    Step("list", "the resulting list", "return xs", lambda xs: list(xs)),
]


@dataclass
class CodeTask:
    entry_point: str
    steps: list[Step]
    reducer: Step

    def reference(self, xs: list[int]) -> Any:
        for step in self.steps:
            xs = step.apply(xs)
        return self.reducer.apply(xs)

    def numbered_phrases(self) -> list[str]:
        """The steps as the prompt and the comments both write them: "(1) keeps the even numbers", ..."""
        return [f"({i}) {step.phrase}" for i, step in enumerate(self.steps, 1)]

    def source(self, comments: bool = False) -> str:
        """The reference function; `comments`: each line under a comment restating its numbered phrase."""
        lines = [f"def {self.entry_point}(xs):"]
        body = [(phrase, step.line) for phrase, step in zip(self.numbered_phrases(), self.steps)]
        body.append((f"returns {self.reducer.phrase}", self.reducer.line))
        for phrase, line in body:
            if comments:
                lines.append(f"    # {phrase}")
            lines.append(f"    {line}")
        return "\n".join(lines)

    def without_step(self, i: int) -> "CodeTask":
        return CodeTask(self.entry_point, self.steps[:i] + self.steps[i + 1:], self.reducer)


def every_step_matters(task: CodeTask, cases: list[list[int]]) -> bool:
    """Whether the program without any one of its steps fails at least one of `cases` (unit-test inputs)."""
    want = [task.reference(xs) for xs in cases]
    return all([task.without_step(i).reference(xs) for xs in cases] != want for i in range(len(task.steps)))


def function_names(split: str) -> list[str]:
    return [f"{v}_{n}" for v in VERBS for n in NOUNS if name_in_split(f"{v}_{n}", split)]


def _task(rng: random.Random, names: list[str], k: int) -> CodeTask:
    """A task of `k` pipeline steps."""
    kinds = rng.sample(TRANSFORMS, k)  # distinct kinds: no "sorts ..., then sorts ..."
    return CodeTask(rng.choice(names), [_transform(kind, rng) for kind in kinds], rng.choice(REDUCERS))


def _random_list(rng: random.Random, length: int) -> list[int]:
    return [rng.randint(-5, 30) for _ in range(length)]


def describe(task: CodeTask, example: list[int]) -> str:
    if task.steps:
        does = ", then ".join(task.numbered_phrases())
        body = f"takes a list of integers, {does}, and returns {task.reducer.phrase}"
    else:
        body = f"takes a list of integers and returns {task.reducer.phrase}"
    return (f"Write a Python function {task.entry_point}(xs) that {body}. "
            f"Example: {task.entry_point}({example!r}) == {task.reference(example)!r}")


def make_tasks(split: str, n: int, seed: int = 0, *, hard: bool = False) -> list[dict]:
    """`n` distinct code tasks of `split` ("train" | "heldout"), fully determined by (split, n, seed, hard).
    `hard`: the train split's hard mix (see the module docstring)."""
    if hard:
        check_hard(NAME, split)
    rng = split_rng(NAME, split, seed)
    names = function_names(split)

    counts, weights = HARD_STEP_COUNTS if hard else STEP_COUNTS[split]

    def one() -> dict:
        k = rng.choices(counts, weights=weights)[0]
        while True:  # a redraw keeps the pipeline length: the mix's 1/2/3-step shares stay as declared
            task = _task(rng, names, k)
            example = [rng.randint(0, 20) for _ in range(rng.randint(4, 6))]
            cases = [example, []] + [_random_list(rng, rng.randint(1, 8)) for _ in range(3)]
            if not hard or every_step_matters(task, cases):
                break
        tests = "\n".join(f"assert {task.entry_point}({xs!r}) == {task.reference(xs)!r}" for xs in cases)
        return task_row(NAME, split, system=SYSTEM, user=describe(task, example), tools=TOOLS,
                        reward={"type": "unit_tests", "tests": tests, "entry_point": task.entry_point},
                        extra={"solution": task.source(), "commented_solution": task.source(comments=True),
                               "example": example,
                               "expected": task.reference(example), "num_steps": len(task.steps)})

    return unique_rows(n, one, what=f"code/{split}")
