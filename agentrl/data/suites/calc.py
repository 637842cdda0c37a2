"""`calc`: arithmetic word problems that need the `calculator` tool.

A problem is a short story whose numbers appear in the text in the order they appear in the expression, so the
skill a small model must learn is *translation*, not arithmetic: copy each number digit by digit into a
`calculator` call, insert the operator each phrase implies ("gets N more" -> `+ N`, "gives away N" -> `- N`,
"A boxes of B each" -> `A * B`, "shares A among B" -> `A / B`), then copy the tool's result into
`<answer>...</answer>`. Operands have 2+ digits (divisors 2-99), so guessing a result is hopeless.

Splits differ in distribution, not only seed:

| split   | operand digits                              | operations per problem    | people          |
|---------|---------------------------------------------|---------------------------|-----------------|
| train   | 2-5                                         | 1 (55%), 2 (35%), 3 (10%) | 20 names        |
| heldout | 3-5, at least one 5-digit operand per problem | 1 (40%), 2 (40%), 3 (20%) | 6 other names   |

so no held-out problem can occur in training (other names), held-out numbers are larger on average and
three-operation chains are twice as common. Held-out numbers stay within the trained digit lengths on
purpose: a model of a million parameters does not extrapolate copying to longer numbers than it was trained on
(it cuts longer operands to the trained length; docs/benchmarks.md).

The train split's *hard mix* (`hard=True`, what the quickstart gives GRPO) keeps the train people and digit
range but draws 1/2/3-operation problems 20/50/30% over 3-5 digit operands, each with at least one 5-digit
operand: RL practises carrying every operand of a longer problem over, in order, including the long numbers
whose repeated digits a tiny model miscopies, which is what held-out problems ask most. One train problem in ten
shows three operations, and the quickstart draws its demonstrations with a fifth (`make_tasks(op_weights=)`,
its `sft_calc_op_weights`): with none, the SFT model never completes a three-operation chain (it answers at once
or calls the wrong tool), so RL, which only reinforces what it samples, has nothing to start from (0 of ~1,000
three-operation rollouts per 40 GRPO steps succeeded); the mixes compared are in docs/quickstart.md.

The reward is `numeric` with tolerance 0 (exact): the numeric reward's default 1e-6 is also a *relative*
tolerance, which would accept an 11-digit answer with its last four digits wrong.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from agentrl.data.suites.common import check_hard, name_in_split, split_rng, task_row, unique_rows

NAME = "calc"
TOOLS = ["calculator"]
# The answer format in words, not as a literal `<answer>N</answer>`: in a literal, "N" follows the exact tokens that
# precede the answer's value, so an in-context copy (induction) head copies "N" instead of the tool's value, a trap
# some initial weights never leave in SFT (docs/log.md, 2026-12-02, 86dae1e).
# The demonstrations show the tags.
SYSTEM = "Use the calculator tool, then give the final number inside answer tags."

# 20 train names and 6 held-out ones (`name_in_split`). Every held-out name is spelt with tokens the train data
# shows (unseen combinations of familiar tokens, as in the lookup suite): a token no training row contains keeps its
# random initial embedding, and a GRPO run then decides by chance what the model does with it. Once "Hana" ("Han")
# and "Vic" ("ic"), which no training text contains, were two of four held-out names, and one GRPO run made the
# model answer at once, without the calculator, for 44 of the 56 "Hana" problems (docs/quickstart.md).
PEOPLE = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Ivo", "Jo", "Kim", "Kora", "Leo", "Mia", "Ned", "Nia",
          "Ola", "Pat", "Pia", "Raj", "Sam", "Sara", "Tia", "Uma", "Wes", "Yan", "Zoe"]
ITEMS = ["apples", "marbles", "stamps", "coins", "books", "pens", "cards", "shells", "beads", "bricks", "seeds",
         "tickets", "bottles", "nails", "stickers", "buttons"]


@dataclass(frozen=True)
class CalcSplit:
    min_digits: int
    max_digits: int
    op_counts: tuple[int, ...]
    op_weights: tuple[float, ...]
    big_digits: int  # every problem has at least one operand with this many digits or more (0: no constraint)


OP_COUNTS = (1, 2, 3)
SPLIT_SPECS = {
    "train": CalcSplit(min_digits=2, max_digits=5, op_counts=OP_COUNTS, op_weights=(0.55, 0.35, 0.10), big_digits=0),
    "heldout": CalcSplit(min_digits=3, max_digits=5, op_counts=OP_COUNTS, op_weights=(0.4, 0.4, 0.2),
                         big_digits=5),
}


# The train split's hard mix (what the quickstart gives GRPO): mostly two- and three-operation problems over the
# upper part of the train range (3-5 digits), each with at least one 5-digit operand. Its names stay train names.
HARD_OP_COUNTS = OP_COUNTS
HARD_OP_WEIGHTS = (0.2, 0.5, 0.3)
HARD_MIN_DIGITS = 3
HARD_BIG_DIGITS = 5


@dataclass
class Problem:
    text: str
    expression: str
    value: int
    operands: list[int]


def _number(rng: random.Random, spec: CalcSplit) -> int:
    digits = rng.randint(spec.min_digits, spec.max_digits)
    return rng.randint(10 ** (digits - 1), 10 ** digits - 1)


def _problem(rng: random.Random, spec: CalcSplit, people: list[str]) -> Problem:
    """One story with `k` operations, built left to right so text order equals expression order."""
    ops = rng.choices(spec.op_counts, weights=spec.op_weights)[0]
    who, item = rng.choice(people), rng.choice(ITEMS)
    if ops == 1 and rng.random() < 0.25:
        # The dividend has the split's digit count too, so train operands stay below 10**max_digits.
        digits = rng.randint(spec.min_digits, spec.max_digits)
        divisor = rng.randint(2, min(99, 10 ** (digits - 1)))
        quotient = rng.randint(max(2, -(-10 ** (digits - 1) // divisor)), (10 ** digits - 1) // divisor)
        total = divisor * quotient
        text = f"{who} shares {total} {item} equally among {divisor} friends. How many {item} does each friend get?"
        return Problem(text, f"{total} / {divisor}", quotient, [total, divisor])
    if rng.random() < 0.4:
        a, b = _number(rng, spec), _number(rng, spec)
        parts, expr, value, operands = [f"{who} buys {a} boxes of {b} {item} each."], f"{a} * {b}", a * b, [a, b]
    else:
        a = _number(rng, spec)
        parts, expr, value, operands = [f"{who} has {a} {item}."], f"{a}", a, [a]
    left = ops - (len(operands) - 1)
    for _ in range(left):
        b = _number(rng, spec)
        if value < 20 or rng.random() < 0.5:
            parts.append(f"Then {who} gets {b} more.")
            expr, value = f"{expr} + {b}", value + b
        else:
            if b >= value:  # keep the count positive: take away a sizeable part of what is there
                b = rng.randint(max(2, value // 10), value - 1)
            parts.append(f"Then {who} gives away {b}.")
            expr, value = f"{expr} - {b}", value - b
        operands.append(b)
    parts.append(f"How many {item} does {who} have now?")
    return Problem(" ".join(parts), expr, value, operands)


def check_op_weights(weights) -> tuple[float, ...]:
    """Shares of 1-, 2- and 3-operation problems: three numbers >= 0, not all 0 (they need not sum to 1)."""
    if (not isinstance(weights, (list, tuple)) or len(weights) != len(OP_COUNTS)
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights)
            or not sum(weights) > 0):
        raise ValueError(f"calc operation weights {weights!r}: give the shares of 1-, 2- and 3-operation problems, "
                         "three numbers >= 0 and not all 0, e.g. [0.45, 0.35, 0.2]")
    return tuple(float(w) for w in weights)


def make_tasks(split: str, n: int, seed: int = 0, *, hard: bool = False,
               op_weights: tuple[float, ...] | None = None) -> list[dict]:
    """`n` distinct calc tasks of `split` ("train" | "heldout"), fully determined by the arguments.
    `hard`: the train split's hard mix (see the module docstring). `op_weights`: the shares of 1-, 2- and
    3-operation problems instead of the split's (or the hard mix's); everything else stays the split's."""
    rng = split_rng(NAME, split, seed)
    spec = SPLIT_SPECS[split]
    people = [p for p in PEOPLE if name_in_split(p, split)]
    if hard:
        check_hard(NAME, split)
        spec = replace(spec, op_counts=HARD_OP_COUNTS, op_weights=HARD_OP_WEIGHTS, min_digits=HARD_MIN_DIGITS,
                       big_digits=HARD_BIG_DIGITS)
    if op_weights is not None:
        spec = replace(spec, op_weights=check_op_weights(op_weights))

    def one() -> dict:
        while True:
            p = _problem(rng, spec, people)
            if not spec.big_digits or max(len(str(x)) for x in p.operands) >= spec.big_digits:
                break
        return task_row(NAME, split, system=SYSTEM, user=p.text, tools=TOOLS,
                        reward={"type": "numeric", "ground_truth": str(p.value), "tolerance": 0.0},
                        extra={"expression": p.expression, "operands": p.operands,
                               "num_ops": p.expression.count(" ") // 2})

    return unique_rows(n, one, what=f"calc/{split}")
