"""`agentrl train CONFIG [key.path=value ...]`: run GRPO training from a YAML config plus dotted overrides.

    agentrl train configs/calc_tiny_cpu.yaml trainer.total_steps=5 actor.lr=1e-5
    agentrl train configs/calc_tiny_cpu.yaml --print-config     # resolved config, no training
    agentrl train configs/calc_tiny_cpu.yaml --check            # check model, data, rewards, tools; no training

Before Ray starts, the model directory, every row of the data files, the reward specs, the tools the tasks name
(tool services are asked for their tool lists) and the loggers' packages are checked; each problem is one line.
The resolved config is written to `trainer.run_dir/config.yaml`; metrics go to `run_dir/metrics.jsonl`.
Running the same command again resumes from the latest complete checkpoint (`trainer.resume: auto`).
"""

from __future__ import annotations

import argparse

from agentrl.trainer.console import CONSOLE_FIELDS_TEXT  # standard library only: --help stays fast

# What each field of the console line means; shown after the options in `agentrl train --help`.
CONSOLE_FIELDS_EPILOG = CONSOLE_FIELDS_TEXT


def _prepared(args: argparse.Namespace, config_cls, check, ready: str):
    """The config of `agentrl train|sft CONFIG [overrides]`, checked (`check`) before any heavy start-up; None when
    the command ends here (`--print-config` printed it, `--check` passed and says `ready`)."""
    import yaml

    from agentrl.config import load_config, to_dict

    cfg = load_config(config_cls, args.config, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return None
    check(cfg)
    if args.check:
        print(f"ok: {args.config} is ready {ready}")
        return None
    return cfg


def _train(args: argparse.Namespace) -> int:
    from agentrl.preflight import check_train
    from agentrl.trainer.config import TrainConfig

    cfg = _prepared(args, TrainConfig, check_train, "to train (model, data, rewards, tools, loggers checked)")
    if cfg is None:
        return 0
    from agentrl.trainer.loop import train

    metrics = train(cfg)
    if not metrics:  # the run was already complete: train() said so and did nothing
        return 0
    print(f"done: {cfg.trainer.total_steps} steps, run dir {cfg.trainer.run_dir}, last reward "
          f"{metrics.get('reward/mean', float('nan')):.3f}")
    return 0


# `agentrl sft CONFIG`: supervised fine-tuning (`agentrl.trainer.sft`). This module's docstring is `agentrl train
# --help`, so the command is described here.
def _sft(args: argparse.Namespace) -> int:
    from agentrl.preflight import check_sft
    from agentrl.trainer.sft import SFTConfig, run_sft

    cfg = _prepared(args, SFTConfig, check_sft, "for SFT (model and demonstration rows checked)")
    if cfg is not None:
        run_sft(cfg)
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("train", help="GRPO training of a tool-using agent (Ray + FSDP2)",
                              description=__doc__, epilog=CONSOLE_FIELDS_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML training config, e.g. configs/calc_tiny_cpu.yaml or examples/calc/config.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.lr=1e-6 trainer.total_steps=20")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--check", action="store_true",
                   help="run the checks done before training (model, data rows, rewards, tools, loggers) and exit")
    p.set_defaults(func=_train)

    p = subparsers.add_parser("sft",
                              help="supervised fine-tuning on tool-use transcripts (cold start), same masking as RL")
    p.add_argument("config", help="YAML file, e.g. configs/sft/tiny_cpu.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.max_steps=50 actor.lr=1e-3")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--check", action="store_true",
                   help="check the model directory and every demonstration row, then exit without training")
    p.set_defaults(func=_sft)


__all__ = ["CONSOLE_FIELDS_EPILOG", "add_commands"]
