"""`agentrl data`: write procedural task suites and their SFT demonstrations.

    agentrl data make calc --split train --n 2000 data/calc-train.jsonl --seed 0
    agentrl data make lookup --split heldout --n 200 data/lookup-heldout.jsonl      # + data/lookup-heldout.kb.jsonl
    agentrl data make calc --split train --hard --n 1000 data/calc-rl.jsonl --seed 1  # more multi-step problems
    agentrl data demos calc --n 2000 data/calc-sft.jsonl --seed 1                   # + data/calc-sft.tasks.jsonl

Use different seeds for the SFT demonstrations and the RL training tasks if the RL prompts should be new to the
model; the held-out split never overlaps either.
"""

from __future__ import annotations

import argparse


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--n must be >= 1, got {value}")
    return value


def _check_outputs(args: argparse.Namespace) -> None:
    from agentrl.preflight import check_output_path

    check_output_path(args.out, "OUT")
    if args.kb is not None:
        check_output_path(args.kb, "--kb")


def _make(args: argparse.Namespace) -> int:
    from agentrl.data.suites import write_suite

    _check_outputs(args)
    paths = write_suite(args.suite, args.split, args.n, args.out, seed=args.seed, kb_path=args.kb, hard=args.hard)
    mix = " (hard mix)" if args.hard else ""
    print(f"wrote {args.n} {args.suite}/{args.split}{mix} tasks: " + ", ".join(str(p) for p in paths))
    return 0


def _demos(args: argparse.Namespace) -> int:
    from agentrl.data.suites.demos import write_demos

    _check_outputs(args)
    paths = write_demos(args.suite, args.n, args.out, seed=args.seed, split=args.split, kb_path=args.kb,
                        sandbox_url=args.sandbox_url)
    print(f"wrote {args.n} {args.suite}/{args.split} demonstrations: " + ", ".join(str(p) for p in paths))
    return 0


def add_commands(subparsers) -> None:
    from agentrl.data.suites import SPLITS, SUITES

    data = subparsers.add_parser("data", help="generate task suites (calc, lookup, code, guess) and SFT demonstrations")
    sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    make = sub.add_parser("make", help="write N tasks of a suite split as JSONL (lookup also writes its KB)")
    make.add_argument("suite", choices=SUITES)
    make.add_argument("out", help="output JSONL path")
    make.add_argument("--split", choices=SPLITS, required=True)
    make.add_argument("--n", type=_count, required=True, help="number of distinct tasks")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--kb", default=None, help="lookup only: where to write the KB (default OUT.kb.jsonl)")
    make.add_argument("--hard", action="store_true",
                      help="train split only: the hard mix for RL (calc: 1/2/3 operations, lookup: 70%% two-hop, "
                           "code: 1/2/3-step pipelines; train names and number ranges)")
    make.set_defaults(func=_make)

    demos = sub.add_parser("demos", help="write N scripted, verified solution transcripts (SFT rows)")
    demos.add_argument("suite", choices=SUITES)
    demos.add_argument("out", help="output JSONL path; the tasks go to OUT.tasks.jsonl")
    demos.add_argument("--n", type=_count, required=True)
    demos.add_argument("--seed", type=int, default=0)
    demos.add_argument("--split", choices=SPLITS, default="train")
    demos.add_argument("--kb", default=None, help="lookup only: where to write the KB (default OUT.kb.jsonl)")
    demos.add_argument("--sandbox-url", default=None,
                       help="code only: run the python calls in this sandbox (default: simulate them locally)")
    demos.set_defaults(func=_demos)
