"""`agentrl train CONFIG [key.path=value ...]`: run GRPO training from a YAML config plus dotted overrides.

    agentrl train configs/tiny-cpu.yaml trainer.total_steps=5 actor.lr=1e-5
    agentrl train configs/tiny-cpu.yaml --print-config          # resolved config, no training

The resolved config is written to `trainer.run_dir/config.yaml`; metrics go to `run_dir/metrics.jsonl`.
Running the same command again resumes from the latest complete checkpoint (`trainer.resume: auto`).
"""

from __future__ import annotations

import argparse
import sys


def _train(args: argparse.Namespace) -> int:
    import yaml

    from agentrl.config import ConfigError, load_config, to_dict
    from agentrl.trainer.config import TrainConfig

    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    from agentrl.trainer.loop import train

    metrics = train(cfg)
    print(f"done: {cfg.trainer.total_steps} steps, run dir {cfg.trainer.run_dir}, last reward "
          f"{metrics.get('reward/mean', float('nan')):.3f}")
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("train", help="GRPO training of a tool-using agent (Ray + FSDP2)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML training config (see configs/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.lr=1e-6 trainer.total_steps=20")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=_train)


__all__ = ["add_commands"]
