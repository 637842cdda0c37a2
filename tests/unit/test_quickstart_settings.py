"""`agentrl quickstart --set key=value`: values take the setting's declared type."""

import dataclasses

import pytest

from agentrl.quickstart import QuickstartSettings, _setting_value

FIELDS = {f.name: f for f in dataclasses.fields(QuickstartSettings)}


def test_numbers_follow_the_declared_type():
    # YAML 1.1 reads "2e-4" as a string; the quickstart must pass a float to the trainer's config.
    assert _setting_value("grpo_lr", "2e-4", FIELDS["grpo_lr"]) == pytest.approx(2e-4)
    assert _setting_value("sft_steps", "150", FIELDS["sft_steps"]) == 150
    assert _setting_value("init", "random", FIELDS["init"]) == "random"
    assert _setting_value("suites", "[calc]", FIELDS["suites"]) == ["calc"]


def test_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(SystemExit, match="sft_steps='many' is not a valid int"):
        _setting_value("sft_steps", "many", FIELDS["sft_steps"])


def test_booleans_read_as_yaml():
    assert _setting_value("grpo_hard_tasks", "false", FIELDS["grpo_hard_tasks"]) is False


@pytest.mark.parametrize("key,option", [("run_dir", "--run-dir"), ("tools_port", "--tools-port")])
def test_settings_with_their_own_option_are_refused_in_set(key, option):
    from agentrl.cli import main

    with pytest.raises(SystemExit, match=f"{key} has its own option; use {option}"):
        main(["quickstart", "--set", f"{key}=1"])
