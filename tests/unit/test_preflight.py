"""The checks before training: each problem a user can make is found, named in one line, all in one pass."""

from __future__ import annotations

import json
import sys

import pytest
from preflight_fixtures import fake_model_dir, refused_ports, services_yaml

from agentrl.agent_loop.config import RewardConfig
from agentrl.config import load_config
from agentrl.data.suites import write_suite
from agentrl.errors import UserError
from agentrl.preflight import (
    PreflightError,
    check_loggers,
    check_model_dir,
    check_output_path,
    check_rewards,
    check_task_envs,
    check_task_tools,
    check_train,
    read_task_files,
    served_tools,
)
from agentrl.tools.config import ToolsConfig
from agentrl.trainer.config import TrainConfig

PROMPT = [{"role": "user", "content": "2+2?"}]


def _row(**fields) -> dict:
    return {"prompt": PROMPT, "reward": {"type": "exact_match", "ground_truth": "4"}, **fields}


def _jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_model_dir_needs_config_weights_and_tokenizer(tmp_path):
    assert check_model_dir(str(fake_model_dir(tmp_path / "m")), "model.path") == []
    assert "is not set" in check_model_dir("", "model.path")[0]
    (missing,) = check_model_dir(str(tmp_path / "nope"), "model.path")
    assert "model.path" in missing and "does not exist" in missing and "agentrl init-model" in missing
    empty = tmp_path / "empty"
    empty.mkdir()
    problems = check_model_dir(str(empty), "--model")
    assert len(problems) == 3 and all(p.startswith("--model: ") for p in problems)
    assert "config.json" in problems[0] and "weights" in problems[1] and "tokenizer" in problems[2]
    (tmp_path / "m" / "config.json").write_text("{not json")
    assert "not a JSON object" in check_model_dir(str(tmp_path / "m"), "model.path")[0]


def test_separate_tokenizer_dir_is_checked_under_its_own_key(tmp_path):
    model = fake_model_dir(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    assert "model.path" in check_model_dir(str(model), "model.path")[0]
    (problem,) = check_model_dir(str(model), "model.path", tokenizer_path=str(tmp_path / "tok"))
    assert problem.startswith("model.tokenizer_path: ") and "does not exist" in problem


def test_every_bad_row_of_every_file_is_reported_with_file_and_row(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", [_row(), _row()])
    bad = _jsonl(tmp_path / "bad.jsonl", [_row(), "{not json", _row(tools="calculator"), {"prompt": PROMPT}])
    files, problems = read_task_files([good, bad, str(tmp_path / "missing.jsonl")], "data.train_files")
    assert [len(f.rows) for f in files] == [2, 1] and files[1].rows[0][0] == 1
    assert problems[0].startswith(f"{bad}:row 2: not valid JSON")
    assert problems[1].startswith(f"{bad}:row 3: field 'tools'")
    assert problems[2].startswith(f"{bad}:row 4: missing field 'reward'")
    assert problems[3].startswith("data.train_files: task file") and "missing.jsonl does not exist" in problems[3]
    assert len(problems) == 4


def test_many_bad_rows_are_capped_with_a_count(tmp_path):
    bad = _jsonl(tmp_path / "bad.jsonl", ["{"] * 10)
    _, problems = read_task_files([bad], "data.train_files")
    assert len(problems) == 4 and problems[-1] == f"{bad}: 7 more malformed rows"


def test_empty_and_unreadable_files(tmp_path):
    empty = _jsonl(tmp_path / "empty.jsonl", [])
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    _, problems = read_task_files([empty, str(fake)], "data.val_files")
    assert problems[0] == f"data.val_files: task file {empty} holds no task rows"
    assert problems[1].startswith(f"data.val_files: {fake} is not a readable parquet file")


def test_reward_specs_resolve_and_unit_tests_need_a_sandbox(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [_row(), _row(reward={"type": "exakt_match", "ground_truth": "4"}),
                                         _row(reward={"type": "numeric"}), _row(reward={"type": "nope:fn"})])
    files, _ = read_task_files([path], "data.train_files")
    problems = check_rewards(files, RewardConfig())
    assert len(problems) == 3
    assert problems[0].startswith(f"{path}:row 2: unknown reward type 'exakt_match'")
    assert problems[1].startswith(f"{path}:row 3: reward type 'numeric' needs field(s) ['ground_truth']")
    assert problems[2].startswith(f"{path}:row 4: reward type") and "cannot import module 'nope'" in problems[2]

    code = write_suite("code", "train", 2, tmp_path / "code.jsonl")[0]
    files, _ = read_task_files([str(code)], "data.train_files")
    (problem,) = check_rewards(files, RewardConfig())
    assert problem.startswith("reward.sandbox_url is not set, but rows 1, 2 of") and "unit_tests" in problem
    with refused_ports() as (port,):
        (problem,) = check_rewards(files, RewardConfig(sandbox_url=f"http://127.0.0.1:{port}"))
    assert problem.startswith(f"reward.sandbox_url http://127.0.0.1:{port}: no sandbox answers")


def test_builtin_tools_are_served_and_unserved_task_tools_are_grouped_per_file(tmp_path):
    served, problems = served_tools(ToolsConfig(builtin=["calculator"]))
    assert served == {"calculator"} and problems == []
    path = _jsonl(tmp_path / "t.jsonl", [_row(tools=["calculator"]), _row(tools=["lookup"]), _row(tools=["lookup"]),
                                         _row(tools=None, tools_kwargs={"python": {}}), _row(tools=None)])
    files, _ = read_task_files([path], "data.train_files")
    problems = check_task_tools(files, served)
    assert len(problems) == 2
    assert problems[0].startswith(f"{path}: rows 2, 3 use tool(s) lookup, which the configured tools do not serve "
                                  "(they serve: calculator)")
    assert problems[1].startswith(f"{path}: row 4 use tool(s) python")


def test_task_environments_are_registered_and_take_the_rows_kwargs(tmp_path):
    game = {"name": "guess_number", "kwargs": {"secret": 3}}
    path = _jsonl(tmp_path / "t.jsonl", [{"env": game}, {"env": {"name": "chess"}}, {"env": {"name": "chess"}},
                                         {"env": {"name": "guess_number", "kwargs": {"secret": 3, "colour": 1}}}])
    files, problems = read_task_files([path], "data.train_files")
    assert problems == []
    problems = check_task_envs(files, load_config(TrainConfig).agent)
    assert len(problems) == 3 and all("\n" not in p for p in problems)
    assert problems[0].startswith(f"{path}:row 2: environment 'chess' is not registered") and \
        "add agent.envs.chess: package.module:Class" in problems[0]
    assert problems[2].startswith(f"{path}:row 4: env 'guess_number' does not accept kwargs ['colour', 'secret']")


def test_every_dead_tool_service_is_named(tmp_path):
    with refused_ports(2) as ports:
        served, problems = served_tools(str(services_yaml(tmp_path / "tools.yaml", ports)), "--tools-config")
    assert served is None and len(problems) == 2
    for port, problem in zip(ports, problems):
        assert f"127.0.0.1:{port}" in problem and "\n" not in problem
    served, problems = served_tools(str(tmp_path / "missing.yaml"), "--tools-config")
    assert served is None and problems[0].startswith("--tools-config: ") and "does not exist" in problems[0]


def test_missing_logger_packages_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec reports a module set to None as not installed
    (problem,) = check_loggers(["console", "jsonl", "wandb"])
    assert "'wandb'" in problem and "pip install -e '.[wandb]'" in problem and "trainer.loggers" in problem


def test_check_train_reports_every_problem_in_one_pass(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    bad = _jsonl(tmp_path / "bad.jsonl", ["{", _row(tools=["lookup"])])
    cfg = load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={tmp_path / 'no-model'}", f"data.train_files=[{bad}]", f"data.val_files=[{tmp_path / 'v.jsonl'}]",
        "trainer.loggers=[console,tensorboard]", f"trainer.resume={tmp_path / 'no-ckpt'}"])
    with pytest.raises(PreflightError) as info:
        check_train(cfg)
    problems = info.value.problems
    assert isinstance(info.value, UserError) and len(problems) == 6
    assert problems[0].startswith("model.path: ") and "row 1: not valid JSON" in problems[1]
    assert "v.jsonl does not exist" in problems[2] and "row 2 use tool(s) lookup" in problems[3]
    assert "'tensorboard'" in problems[4] and "trainer.resume=" in problems[5]


def test_output_paths(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="is a directory"):
        check_output_path(tmp_path, "OUT")
    with pytest.raises(UserError, match="is a file, so nothing can be written below it"):
        check_output_path(tmp_path / "f" / "x.jsonl", "OUT")
    with pytest.raises(UserError, match="exists and is a file"):
        check_output_path(tmp_path / "f", "init-model OUT", directory=True)
    check_output_path(tmp_path / "new" / "x.jsonl", "OUT")


def test_stdin_stdout_rewards_need_a_sandbox_too(tmp_path):
    reward = {"type": "stdin_stdout", "cases": [{"input": "1\n", "output": "2"}]}
    path = _jsonl(tmp_path / "t.jsonl", [_row(reward=reward)])
    files, _ = read_task_files([path], "data.train_files")
    (problem,) = check_rewards(files, RewardConfig())
    assert problem.startswith("reward.sandbox_url is not set, but row 1 of") and "stdin_stdout rewards" in problem
