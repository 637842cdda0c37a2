"""`agentrl train`: the resolved config is printed with overrides applied; a typo fails before any work."""

from __future__ import annotations

import yaml

from agentrl.cli import main


def test_print_config_applies_overrides(capsys):
    assert main(["train", "configs/calc_tiny_cpu.yaml", "actor.lr=3e-6", "rollout.n=2", "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["actor"]["lr"] == 3e-6 and cfg["rollout"]["n"] == 2
    assert cfg["trainer"]["resume"] == "auto"


def test_misspelled_key_names_the_nearest_valid_one(capsys):
    assert main(["train", "configs/calc_tiny_cpu.yaml", "actor.kl_los_coef=0.1"]) == 2
    assert "did you mean 'actor.kl_loss_coef'" in capsys.readouterr().err


def test_overrides_and_flags_in_any_order(capsys):
    assert main(["train", "configs/calc_tiny_cpu.yaml", "--print-config", "trainer.total_steps=3",
                 "actor.lr=2e-5"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["trainer"]["total_steps"] == 3 and cfg["actor"]["lr"] == 2e-5


def test_every_command_with_overrides_takes_them_after_its_flags():
    import argparse

    from agentrl.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    with_overrides = {name: p for name, p in commands.items()
                      if any(a.dest == "overrides" and not a.option_strings for a in p._actions)}
    assert {"train", "sft"} <= set(with_overrides)
    for name, sub in with_overrides.items():
        flags = [a.option_strings[0] for a in sub._actions
                 if a.option_strings and a.nargs == 0 and a.dest not in ("help",)]
        args = parser.parse_args([name, "some.yaml", flags[0], "a.b=1", flags[-1], "c.d=2"])
        assert args.config == "some.yaml" and args.overrides == ["a.b=1", "c.d=2"], name
