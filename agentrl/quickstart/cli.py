"""`agentrl quickstart [--suites NAMES] [--async] [--smoke] [--set KEY=VALUE ...]`: the recipe in
recipes/quickstart, run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

RUN_DIR, SMOKE_RUN_DIR = "runs/quickstart", "runs/quickstart-smoke"


def settings_from_args(args: argparse.Namespace):
    """The resolved recipe of `agentrl quickstart ...`: the recipe folder, the overlays of the run's suites, of
    --async and of --smoke, then --set (`load_recipe`)."""
    from agentrl.quickstart.recipe import RECIPE_DIR, QuickstartError, load_recipe

    suites = None
    if args.suites is not None:
        suites = [name.strip() for name in args.suites.split(",")]
        if not all(suites):
            raise QuickstartError(f"quickstart --suites {args.suites!r}: give comma-separated names, e.g. calc,lookup")
    return load_recipe(Path(args.recipe) if args.recipe else RECIPE_DIR, suites=suites, smoke=args.smoke,
                       asynchronous=args.asynchronous, sets=args.set)


def _main(args: argparse.Namespace) -> int:
    from agentrl.quickstart.run import run_quickstart
    from agentrl.services import ServiceStartError, sigterm_as_interrupt

    cfg = settings_from_args(args)
    if cfg.pin_kernels:  # before torch computes anything, here or in the services and Ray workers started below
        from agentrl.numerics import pin_cpu_kernels

        pin_cpu_kernels()
    sigterm_as_interrupt()
    try:
        run_quickstart(cfg, args.run_dir or (SMOKE_RUN_DIR if args.smoke else RUN_DIR), tools_port=args.tools_port,
                       sandbox_port=args.sandbox_port, with_sandbox=not args.no_sandbox, smoke=args.smoke)
    except ServiceStartError as e:
        print(f"quickstart: {e}", file=sys.stderr)
        return 1
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="end to end on CPU: model, data, services, SFT, eval, GRPO, eval, report")
    p.add_argument("--run-dir", default=None,
                   help=f"where everything goes (default {RUN_DIR}; with --smoke {SMOKE_RUN_DIR}); an earlier run "
                        "there is moved aside")
    p.add_argument("--smoke", action="store_true",
                   help="a minutes-long miniature run (the recipe's smoke/ overlay) that checks every phase works")
    p.add_argument("--async", dest="asynchronous", action="store_true",
                   help="asynchronous off-policy GRPO (the recipe's async/ overlay: trainer.mode async, "
                        "max_staleness 2, token-level TIS); docs/async.md")
    p.add_argument("--tools-port", type=int, default=None)
    p.add_argument("--sandbox-port", type=int, default=None)
    p.add_argument("--no-sandbox", action="store_true", help="do not start the sandbox (calc/lookup do not need it)")
    p.add_argument("--suites", default=None, metavar="NAMES",
                   help="comma-separated task suites (default calc,lookup; also: code, guess). One suite with a "
                        "folder in the recipe (code, guess) starts from its overlays, under --smoke and --set")
    p.add_argument("--recipe", default=None, metavar="DIR",
                   help="a recipe folder (default: recipes/quickstart of the agentrl source tree)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override a recipe key: the quickstart's own (seed=1, data.demos.calc=1000), sft.<agentrl sft "
                        "key> (sft.sft.max_steps=300) or train.<agentrl train key> (train.actor.lr=2e-4)")
    p.set_defaults(func=_main)
