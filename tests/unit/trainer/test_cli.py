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
