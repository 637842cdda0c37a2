"""Bad input on the command line: one `error:` line per problem on stderr, exit code 2, never a traceback (unless
AGENTRL_DEBUG=1), each line naming the thing and the fix. Plus: help texts name files that exist, --version."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from preflight_fixtures import fake_model_dir, refused_ports, services_yaml

from agentrl.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "calc_tiny_cpu.yaml")
SFT_CONFIG = str(REPO / "configs" / "sft" / "tiny_cpu.yaml")
VERL_PROMPT = [{"role": "user", "content": "What is 12 * 7? Use the calculator."}]


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)


def user_error(capsys, argv: list[str], *words: str, lines: int = 1) -> list[str]:
    """Run `agentrl ARGV`; assert exit 2 and `lines` lines on stderr, each an `error:` line, containing `words`."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    got = err.splitlines()
    assert len(got) == lines and all(line.startswith("error: ") for line in got), err
    for word in words:
        assert word in err, err
    return got


def verl_parquet(path: Path, tool: str, n: int = 3) -> Path:
    """Rows as verl's data preprocessing writes them (the README's "bring your own dataset" example)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "openai/gsm8k", "prompt": VERL_PROMPT, "ability": "math", "agent_name": "tool_agent",
             "reward_model": {"style": "rule", "ground_truth": "84"},
             "extra_info": {"index": i, "split": "train",
                            "tools_kwargs": {tool: {"create_kwargs": {"ground_truth": "84"}}}}}
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# -- train ---------------------------------------------------------------------------------------------------------

def test_train_missing_config_file(capsys, tmp_path):
    user_error(capsys, ["train", str(tmp_path / "nope.yaml")], "config file", "nope.yaml does not exist")


def test_train_config_typo(capsys):
    user_error(capsys, ["train", CONFIG, "actor.kl_los_coef=0.1"], "did you mean 'actor.kl_loss_coef'")


def test_train_reports_model_and_data_problems_in_one_pass(capsys, tmp_path):
    got = user_error(capsys, ["train", CONFIG, f"model.path={tmp_path / 'm'}",
                              f"data.train_files=[{tmp_path / 't.jsonl'}]", f"data.val_files=[{tmp_path / 'v.jsonl'}]"],
                     lines=3)
    assert "model.path" in got[0] and "agentrl init-model" in got[0]
    assert "data.train_files" in got[1] and "t.jsonl does not exist" in got[1] and "agentrl data make" in got[1]
    assert "data.val_files" in got[2] and "v.jsonl does not exist" in got[2]


def test_train_without_data_files(capsys, tmp_path):
    user_error(capsys, ["train", CONFIG, f"model.path={fake_model_dir(tmp_path / 'm')}", "data.train_files=[]",
                        "data.val_files=[]"], "data.train_files is empty")


def test_train_tools_section_that_cannot_be_built(capsys, tmp_path):
    train = verl_parquet(tmp_path / "train.parquet", "calculator")
    user_error(capsys, ["train", CONFIG, f"model.path={fake_model_dir(tmp_path / 'm')}", f"data.train_files=[{train}]",
                        "data.val_files=[]", "tools.functions=[no_such_module:fn]"],
               "tools: ", "no_such_module")


def test_train_names_file_row_and_field_of_a_bad_row(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"prompt": VERL_PROMPT, "reward": {"type": "exact_match", "ground_truth": "84"}}) + "\n"
                    + json.dumps({"prompt": VERL_PROMPT, "rewards": {}}) + "\n")
    user_error(capsys, ["train", CONFIG, f"model.path={model}", f"data.train_files=[{data}]", "data.val_files=[]",
                        "--check"], f"{data}:row 2", "'rewards'")


def test_readme_verl_parquet_example_passes_the_checks(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    train = verl_parquet(tmp_path / "train.parquet", "calculator")
    test = verl_parquet(tmp_path / "test.parquet", "calculator")
    assert main(["train", CONFIG, f"data.train_files=[{train}]", f"data.val_files=[{test}]", f"model.path={model}",
                 "--check"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok: ") and err == ""


def test_train_task_tool_not_served(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    train = verl_parquet(tmp_path / "train.parquet", "calc_gsm8k_reward")
    user_error(capsys, ["train", CONFIG, f"data.train_files=[{train}]", "data.val_files=[]", f"model.path={model}"],
               f"{train}: rows 1, 2, 3 use tool(s) calc_gsm8k_reward", "they serve: calculator")


def test_train_dead_tool_services_one_line_each(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    train = verl_parquet(tmp_path / "train.parquet", "calculator")
    with refused_ports(2) as ports:
        got = user_error(capsys, ["train", CONFIG, f"data.train_files=[{train}]", "data.val_files=[]",
                                  f"model.path={model}", "tools.builtin=[]",
                                  f"tools.config={services_yaml(tmp_path / 'tools.yaml', ports)}"], lines=2)
    for port, line in zip(ports, got):
        assert f"127.0.0.1:{port}" in line and "agentrl tools serve" in line


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    from agentrl.preflight import PreflightError

    monkeypatch.setenv("AGENTRL_DEBUG", "1")
    with pytest.raises(PreflightError):
        main(["train", CONFIG, f"model.path={tmp_path / 'm'}"])


def test_console_script_prints_one_line_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_DEBUG"}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", CONFIG, f"model.path={tmp_path / 'm'}", "data.val_files=[]",
           f"data.train_files=[{tmp_path / 't.jsonl'}]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line.split(":")[0] for line in proc.stderr.splitlines()] == ["error", "error"]


# -- sft -----------------------------------------------------------------------------------------------------------

def test_sft_missing_model_and_data(capsys):
    got = user_error(capsys, ["sft", SFT_CONFIG], lines=2)
    assert "model.path is not set" in got[0] and "data.train_files is empty" in got[1]
    assert "agentrl data demos" in got[1]


def test_sft_bad_demo_rows(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"messages": "hi"}) + "\n")
    user_error(capsys, ["sft", SFT_CONFIG, f"model.path={model}", f"data.train_files=[{demos},{tmp_path / 'x.jsonl'}]"],
               "d.jsonl:1: field 'messages'", "x.jsonl does not exist", lines=2)


def test_sft_check_passes(capsys, tmp_path):
    model = fake_model_dir(tmp_path / "m")
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"messages": VERL_PROMPT + [{"role": "assistant", "content": "84"}]}) + "\n")
    assert main(["sft", SFT_CONFIG, f"model.path={model}", f"data.train_files=[{demos}]", "--check"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


# -- eval ----------------------------------------------------------------------------------------------------------

def test_eval_missing_model(capsys, tmp_path):
    user_error(capsys, ["eval", "--model", str(tmp_path / "nope"), "--suite", "calc"], "--model", "does not exist")


def test_eval_not_a_model_dir(capsys, tmp_path):
    user_error(capsys, ["eval", "--model", str(tmp_path), "--suite", "calc"], "neither a model directory",
               "agentrl init-model")


def test_eval_finished_evaluation_needs_compare(capsys, tmp_path):
    (tmp_path / "eval.json").write_text("{}")
    user_error(capsys, ["eval", "--model", str(tmp_path)], "is a finished evaluation", "--compare")


def test_eval_needs_a_suite(capsys, tmp_path):
    user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m"))], "--suite NAME|FILE.jsonl is required")


def test_eval_unknown_suite(capsys, tmp_path):
    user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m")), "--suite", "calcx",
                        "--out", str(tmp_path / "out")], "'calcx'", "suites: calc, lookup, code")


def test_eval_bad_task_rows(capsys, tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("{\n[]\n")
    user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m")), "--suite", str(tasks)],
               f"{tasks}:row 1: not valid JSON", f"{tasks}:row 2: a task row must be a JSON object", lines=2)


def test_eval_dead_tool_service(capsys, tmp_path):
    with refused_ports() as ports:
        user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m")), "--suite", "calc",
                            "--num-tasks", "2", "--out", str(tmp_path / "out"),
                            "--tools-config", str(services_yaml(tmp_path / "tools.yaml", ports))],
                   f"127.0.0.1:{ports[0]}", "services[0].url")


def test_eval_out_is_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m")), "--suite", "calc",
                        "--out", str(tmp_path / "f")], "--out", "exists and is a file")


def test_eval_sampling_settings(capsys, tmp_path):
    user_error(capsys, ["eval", "--model", str(fake_model_dir(tmp_path / "m")), "--suite", "calc", "--num-tasks", "2",
                        "--out", str(tmp_path / "out"), "--n", "2", "--temperature", "0", "--k", "4"],
               "--temperature", "--k 4", lines=2)


# -- data, init-model ----------------------------------------------------------------------------------------------

def test_data_make_hard_heldout(capsys, tmp_path):
    user_error(capsys, ["data", "make", "calc", str(tmp_path / "x.jsonl"), "--split", "heldout", "--hard", "--n", "3"],
               "--hard", "--split train")
    assert not (tmp_path / "x.jsonl").exists()


def test_data_make_code_hard_heldout(capsys, tmp_path):
    user_error(capsys, ["data", "make", "code", str(tmp_path / "x.jsonl"), "--split", "heldout", "--hard", "--n", "3"],
               "--hard", "--split train")


def test_data_make_out_is_a_directory(capsys, tmp_path):
    user_error(capsys, ["data", "make", "calc", str(tmp_path), "--split", "train", "--n", "3"], "is a directory")


def test_data_demos_dead_sandbox(capsys, tmp_path):
    with refused_ports() as (port,):
        user_error(capsys, ["data", "demos", "code", str(tmp_path / "d.jsonl"), "--n", "1",
                            "--sandbox-url", f"http://127.0.0.1:{port}"], "tool python could not run", "--sandbox-url")


def test_init_model_out_is_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    user_error(capsys, ["init-model", str(tmp_path / "f")], "exists and is a file")


# -- help and version ----------------------------------------------------------------------------------------------

def _all_help(parser: argparse.ArgumentParser, name: str = "agentrl"):
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _all_help(sub, f"{name} {sub_name}")


def test_every_path_named_in_a_help_text_exists(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: a path never breaks across lines (argparse breaks on '-')
    named = [(name, path) for name, text in _all_help(build_parser())
             for path in re.findall(r"\b(?:configs|examples)/[\w./-]*\w", text)]
    assert any(name == "agentrl train" for name, _ in named) and any(name == "agentrl sft" for name, _ in named)
    missing = [f"{name}: {path}" for name, path in named if not (REPO / path).exists()]
    assert missing == []


def test_version(capsys):
    from agentrl.cli import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"agentrl {version()}" and re.fullmatch(r"\d+\.\d+\.\d+.*", version())


def test_a_dead_trainer_rank_is_one_line_and_exit_3(capsys, monkeypatch):
    from agentrl import cli
    from agentrl.errors import EXIT_INFRA, RankDiedError

    def dies(args):
        raise RankDiedError("WorkerGroup rank 1 of 2 on node 10.0.0.2 (id 1234) died during update_policy", rank=1,
                            node="10.0.0.2 (id 1234)")

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=dies)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert main([]) == EXIT_INFRA
    assert capsys.readouterr().err == "error: WorkerGroup rank 1 of 2 on node 10.0.0.2 (id 1234) died during " \
                                      "update_policy\n"
