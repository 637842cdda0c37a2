"""The `agentrl` command.

Every subcommand lives in the module that owns the concept; this file only lists them. A command module exposes
`add_commands(subparsers)`; a benchmark module exposes `add_arguments(parser)` and `run(args) -> int`. Command
modules import heavy libraries (torch, transformers, ray) inside their handlers so `agentrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Explicit list, no discovery: a command appears here when its module exists and works.
COMMAND_MODULES: list[str] = [
    "agentrl.models.cli",
    "agentrl.inference.cli",
    "agentrl.agent_loop.cli",
    "agentrl.data.cli",
    "agentrl.tools.cli",
    "agentrl.evaluation.cli",
    "sandbox.cli",
    "agentrl.trainer.cli",
    "agentrl.trainer.export",
    "agentrl.quickstart.cli",
    "agentrl.viewer.cli",
]

# `agentrl bench NAME`: NAME -> module with add_arguments(parser) and run(args).
BENCH_MODULES: dict[str, str] = {
    "tools": "agentrl.tools.bench",
    "engine": "agentrl.inference.bench",
    "replicas": "agentrl.inference.replicas_bench",
    "rollout": "agentrl.agent_loop.bench",
    "rewards": "agentrl.agent_loop.reward_bench",
    "sandbox": "sandbox.bench",
    "train": "agentrl.trainer.bench",
    "step": "agentrl.trainer.step_bench",
    "async": "agentrl.trainer.async_bench",
    "weight-sync": "agentrl.trainer.weight_sync_bench",
    "lora": "agentrl.trainer.lora_bench",
    "view": "agentrl.viewer.bench",
}


def version() -> str:
    """The installed distribution's version; the source tree's `agentrl.__version__` when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("agentrl")
    except PackageNotFoundError:
        from agentrl import __version__

        return __version__


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: options and positionals in any order, so `agentrl train CONFIG --check k=v` reads as
    `agentrl train CONFIG k=v --check` (plain argparse stops filling `overrides` at the first option). A parser whose
    positionals argparse cannot intermix (a nested subcommand, a `--` remainder) parses as usual."""

    _parsing = False  # parse_known_intermixed_args calls parse_known_args itself (Python 3.11, 3.12)

    def parse_known_args(self, args=None, namespace=None):
        mixable = all(a.nargs not in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions())
        if self._parsing or not mixable:
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Train tool-using LLM agents with reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"agentrl {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    if BENCH_MODULES:
        bench = sub.add_parser("bench", help="measure throughput and latency (prints side-by-side ratios)")
        bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
        for bench_name, module_name in BENCH_MODULES.items():
            module = importlib.import_module(module_name)
            doc = (module.__doc__ or "").strip().splitlines()
            p = bench_sub.add_parser(bench_name, help=doc[0] if doc else None)
            module.add_arguments(p)
            p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from agentrl.services import exit_with_parent

    exit_with_parent()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from agentrl.errors import (
        EXIT_INFRA,
        EXIT_USER,
        InfraFailureError,
        RankDiedError,
        UserError,
        debug_enabled,
        one_line,
    )
    from agentrl.preflight import PreflightError

    try:
        code = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as e:
        if debug_enabled():
            raise
        for line in e.problems if isinstance(e, PreflightError) else [one_line(e)]:  # one line per problem
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USER
    except (InfraFailureError, RankDiedError) as e:  # a service kept failing, a rank died: the run stopped itself
        if debug_enabled():
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_INFRA
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
