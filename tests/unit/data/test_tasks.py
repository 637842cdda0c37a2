from __future__ import annotations

import json

import pytest

from agentrl.data.tasks import TaskFormatError, load_tasks

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
    assert task.tools is None and task.task_id == "gsm8k-7"
    assert task.tools_kwargs == {"calc_gsm8k_reward": {"ground_truth": "2"}}  # verl's create_kwargs unwrapped
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
    assert load_tasks(vpath)[0].reward == {"type": "exact_match", "ground_truth": "2"}


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
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "nope.jsonl")


def test_suite_rows_load(tmp_path):
    from agentrl.data.suites import write_suite

    paths = write_suite("calc", "train", 3, tmp_path / "calc.jsonl", seed=0)
    tasks = load_tasks(paths[0])
    assert len(tasks) == 3 and all(t.reward["type"] for t in tasks) and all(t.task_id for t in tasks)
