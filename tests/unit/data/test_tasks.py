from __future__ import annotations

import json
import re

import pytest

from agentrl.data.tasks import TaskFileNotFoundError, TaskFormatError, load_tasks, read_tasks
from agentrl.errors import UserError

ROW = {"prompt": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+2?"}],
       "tools": ["calculator"], "reward": {"type": "numeric", "ground_truth": "4", "tolerance": 1e-6},
       "data_source": "calc/train", "tools_kwargs": {"calculator": {"precision": 3}}, "task_id": "calc-1"}
VERL_ROW = {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "1+1?"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"}, "agent_name": "tool_agent",
            "extra_info": {"index": 7, "split": "train", "need_tools_kwargs": True,
                           "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "2"}}}}}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_project_rows_from_jsonl(tmp_path):
    (task,) = load_tasks(write_jsonl(tmp_path / "t.jsonl", [ROW]))
    assert task.prompt == ROW["prompt"] and task.tools == ["calculator"] and task.task_id == "calc-1"
    assert task.reward == ROW["reward"] and task.tools_kwargs == {"calculator": {"precision": 3}}
    assert task.data_source == "calc/train"


def test_optional_fields_default(tmp_path):
    (task,) = load_tasks(write_jsonl(tmp_path / "t.jsonl", [{"prompt": ROW["prompt"],
                                                              "reward": {"type": "exact_match", "ground_truth": "x"}}]))
    assert task.tools is None and task.tools_kwargs == {} and task.data_source == "unknown"


def test_verl_rows(tmp_path):
    (task,) = load_tasks(write_jsonl(tmp_path / "v.jsonl", [VERL_ROW]), verl_reward_type="numeric")
    assert task.reward == {"type": "numeric", "ground_truth": "2"}
    assert task.task_id == "gsm8k-7"
    assert task.tools_kwargs == {"calc_gsm8k_reward": {"ground_truth": "2"}}  # verl's create_kwargs unwrapped
    assert task.tools == ["calc_gsm8k_reward"]  # the tools the row gives kwargs to
    (listed,) = load_tasks(write_jsonl(tmp_path / "w.jsonl", [{**VERL_ROW, "tools": ["calculator"]}]))
    assert listed.tools == ["calculator"]
    bare = {k: v for k, v in VERL_ROW.items() if k != "extra_info"}
    assert load_tasks(write_jsonl(tmp_path / "b.jsonl", [bare]))[0].tools is None  # no kwargs: every tool
    assert task.extra["agent_name"] == "tool_agent" and task.extra["ability"] == "math"


def test_parquet_rows_both_styles(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([ROW, ROW]), path)
    tasks = load_tasks(path, limit=1)
    assert len(tasks) == 1 and tasks[0].reward["ground_truth"] == "4" and tasks[0].prompt == ROW["prompt"]
    vpath = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist([VERL_ROW]), vpath)
    assert load_tasks(vpath)[0].reward == {"type": "verl", "ground_truth": "2", "data_source": "gsm8k"}


@pytest.mark.parametrize("mutate,message", [
    (lambda r: r.pop("prompt"), "missing field 'prompt'"),
    (lambda r: r.pop("reward"), "missing field 'reward'"),
    (lambda r: r.update(reward={"ground_truth": "4"}), "'type' string"),
    (lambda r: r.update(prompt=[{"role": "robot", "content": "x"}]), r"prompt\[0\].role"),
    (lambda r: r.update(prompt=[{"role": "user", "content": None}]), r"prompt\[0\].content"),
    (lambda r: r.update(tools="calculator"), "list of tool names"),
    (lambda r: r.update(tool_kwargs={}), r"unknown field\(s\) \['tool_kwargs'\]"),
    (lambda r: r.update(tools_kwargs=[]), "'tools_kwargs' must be an object"),
])
def test_malformed_rows_name_file_row_and_field(tmp_path, mutate, message):
    bad = json.loads(json.dumps(ROW))
    mutate(bad)
    path = write_jsonl(tmp_path / "bad.jsonl", [ROW, bad])
    with pytest.raises(TaskFormatError, match=message) as info:
        load_tasks(path)
    assert f"{path}:row 2" in str(info.value)


def test_invalid_json_line_and_missing_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n{not json\n")
    with pytest.raises(TaskFormatError, match=r"broken.jsonl:row 3: not valid JSON"):
        load_tasks(path)
    with pytest.raises(TaskFileNotFoundError, match="nope.jsonl does not exist") as info:
        load_tasks(tmp_path / "nope.jsonl")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, UserError)


def test_read_tasks_yields_every_row_or_its_error(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(ROW) + "\n{\n" + json.dumps({"prompt": ROW["prompt"]}) + "\n\n" + json.dumps(ROW) + "\n")
    items = list(read_tasks(path))
    assert [n for n, _ in items] == [1, 2, 3, 5]
    assert [type(t).__name__ for _, t in items] == ["Task", "TaskFormatError", "TaskFormatError", "Task"]
    assert "mixed.jsonl:row 3: missing field 'reward'" in str(items[2][1])


def test_a_file_that_is_not_a_task_file_is_one_clear_error(tmp_path):
    binary = tmp_path / "model.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TaskFormatError, match="is not UTF-8 text"):
        load_tasks(binary)
    fake = tmp_path / "t.parquet"
    fake.write_text("not parquet")
    with pytest.raises(TaskFormatError, match="is not a readable parquet file"):
        load_tasks(fake)


def test_verl_parquet_infers_each_rows_tools_from_its_tools_kwargs(tmp_path):
    """verl preprocessing writes one struct column for extra_info: parquet fills the tools a row does not use
    with null, and those must not become tools of that row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**VERL_ROW, "extra_info": {"index": i, "tools_kwargs": kwargs}} for i, kwargs in enumerate([
        {"calculator": {"create_kwargs": {"precision": 3}}},
        {"lookup": {"create_kwargs": {"kb_path": "kb.jsonl"}}},
        {}])]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(path)
    assert [t.tools for t in tasks] == [["calculator"], ["lookup"], None]
    assert tasks[0].tools_kwargs == {"calculator": {"precision": 3}} and tasks[2].tools_kwargs == {}
    assert [t.task_id for t in tasks] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]


def test_suite_rows_load(tmp_path):
    from agentrl.data.suites import write_suite

    paths = write_suite("calc", "train", 3, tmp_path / "calc.jsonl", seed=0)
    tasks = load_tasks(paths[0])
    assert len(tasks) == 3 and all(t.reward["type"] for t in tasks) and all(t.task_id for t in tasks)


def test_env_rows_need_no_prompt_nor_reward_and_malformed_env_fields_are_named(tmp_path):
    game = {"name": "guess_number", "kwargs": {"secret": 3}}
    write_jsonl(tmp_path / "t.jsonl", [{"env": game}, {"env": {"name": "guess_number"}, **ROW, "tools": None}])
    bare, full = load_tasks(tmp_path / "t.jsonl")
    assert (bare.env, bare.prompt, bare.reward) == (game, [], {"type": "env"})
    assert full.env == {"name": "guess_number", "kwargs": {}} and full.reward["type"] == "numeric"
    for env, message in [("x", "field 'env' must be an object with a 'name' string"),
                         ({"name": "g", "args": {}}, "unknown field(s) ['args'] in 'env'"),
                         ({"name": "g", "kwargs": [1]}, "field 'env.kwargs' must be an object")]:
        write_jsonl(tmp_path / "bad.jsonl", [{"env": env}])
        with pytest.raises(TaskFormatError, match=rf"bad.jsonl:row 1: {re.escape(message)}"):
            load_tasks(tmp_path / "bad.jsonl")
