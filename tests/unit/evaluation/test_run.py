"""`agentrl.evaluation.run.evaluate` and `agentrl eval`: eval.json/eval.md, numbers, sampling defaults, compare.

Most tests drive `evaluate` with `SolverEngine`, a scripted policy that solves calc/lookup suite tasks with real
in-process tools and gets chosen tasks wrong on purpose, so every reported number is known in advance.
"""

from __future__ import annotations

import json
import re

import pytest

from agentrl.evaluation.metrics import summarize
from agentrl.evaluation.plots import pass_at_k_curve, plot_pass_at_k
from agentrl.evaluation.run import (
    EVAL_JSON,
    EVAL_MD,
    compare_markdown,
    default_ks,
    evaluate,
    load_eval,
    resolve_temperature,
    suite_tasks,
)
from agentrl.inference.base import EngineError
from agentrl.tools.builtin.calculator import result_value
from agentrl.types import Episode, Generation, SamplingParams

_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


class SolverEngine:
    """Engine protocol, scripted: solves suite tasks through their tools, with per-task behaviour.

    `kinds[task_index]` (the task is found from the user question in the prompt):
    "right": call the tool, answer from its output; "wrong": same, but answer a wrong value;
    "flaky": right on sample 0 only (the sample index is the tail of the loop's session id);
    "detour": first call an unknown tool (a policy error), then solve; "down": raise EngineError (infra).
    """

    def __init__(self, tokenizer, tasks, kinds: list[str]):
        self.tokenizer = tokenizer
        self.max_model_len = 2048
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.by_question = {t.prompt[-1]["content"]: (i, t) for i, t in enumerate(tasks)}
        self.kinds = kinds

    async def generate(self, input_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None) -> Generation:
        text = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        index, task = next(v for q, v in self.by_question.items() if q in text)
        kind = self.kinds[index]
        if kind == "down":
            raise EngineError("scripted engine: server unreachable")
        responses = _TOOL_RESPONSE.findall(text)
        sample = int((session_id or "x-0").rsplit("-", 1)[1])
        tool = task.tools[0]
        argument = {"calculator": {"expression": task.extra.get("expression")},
                    "lookup": {"entity": task.extra.get("entity")},
                    "python": {"code": f"{task.extra.get('solution')}\n"
                                       f"print({task.reward.get('entry_point')}({task.extra.get('example')}))"}}[tool]
        wrong = kind == "wrong" or (kind == "flaky" and sample != 0)
        if kind == "detour" and not responses:
            reply = _call("abacus", argument)
        elif not responses or responses[-1].startswith("Error"):
            reply = _call(tool, argument)
        elif tool == "python":
            code = f"def {task.reward['entry_point']}(xs):\n    return -1" if wrong else task.extra["solution"]
            reply = f"```python\n{code}\n```"
        else:
            answer = str(task.reward["ground_truth"]) if tool == "lookup" else result_value(responses[-1])
            reply = f"<answer>{'wrong ' + answer + '1' if wrong else answer}</answer>"
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_of_turn_id]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    async def update_weights(self, weights, *, version: int | None = None) -> None:
        return None


def _call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _episodes(run_dir) -> list[Episode]:
    rows = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    return [Episode.from_dict({k: v for k, v in row.items() if k not in ("step", "sample_index")}) for row in rows]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


KINDS = ["wrong", "flaky", "right", "detour", "wrong", "flaky", "right", "detour", "down"]


async def test_evaluate_writes_consistent_eval_json_and_markdown(tiny_model_dir, tokenizer, tmp_path, capsys):
    tasks = suite_tasks("calc", num_tasks=len(KINDS), out_dir=tmp_path / "data")
    run_dir = tmp_path / "run"
    summary = await evaluate(tiny_model_dir, tasks, n=2, engine=SolverEngine(tokenizer, tasks, KINDS),
                             run_dir=run_dir, name="solver", tasks_source="calc test")
    # stderr is not a terminal here: plain progress lines with an ETA, as a log file would get them
    progress = capsys.readouterr().err.splitlines()
    assert progress[0].startswith("eval solver: 2/18 episodes (11%), ") and "eta" in progress[0]
    assert progress[-1].startswith("eval solver: 18/18 episodes (100%)") and len(progress) == 10
    record = load_eval(run_dir)
    assert record["summary"] == summary
    # the numbers a user reads, known from the script: 8 valid tasks with c = 0, 1, 2, 2 (twice each) of n = 2
    assert summary["pass@1"] == pytest.approx((0 + 0.5 + 1 + 1) / 4)
    assert summary["pass@2"] == pytest.approx(3 / 4)
    assert summary["mean@n"] == pytest.approx(10 / 16)
    assert summary["avg_turns"] == pytest.approx((2 * 6 + 3 * 2) / 8)
    assert summary["tool_calls_per_episode"] == pytest.approx(20 / 16)
    assert summary["tool_error_rate"] == pytest.approx(4 / 20)
    assert summary["tool_errors_by_kind"] == {"unknown_tool": 4}
    assert summary["infra_failed_episodes"] == 2 and summary["tasks_without_valid_samples"] == 1
    # eval.json agrees with an independent summary of the dumped episodes, and holds per-task rows
    assert summarize(_episodes(run_dir), ks=[1, 2]) == summary
    assert [row["correct"] for row in record["tasks"]] == [0, 1, 2, 2, 0, 1, 2, 2, 0]
    assert record["tasks"][2]["answer"] == f"<answer>{tasks[2].reward['ground_truth']}</answer>"
    assert record["infra_failures"]["by_cause"] == {"engine_error": 2}
    assert "unreachable" in record["infra_failures"]["examples"][0]["detail"]
    assert record["settings"] == {**record["settings"], "n": 2, "ks": [1, 2], "temperature": 1.0, "greedy": False}
    assert record["config"]["tools"]["names"] == ["calculator"]
    assert record["config"]["agent"]["max_assistant_turns"] == 8
    markdown = (run_dir / EVAL_MD).read_text()
    assert "| pass@1 | 62.5% |" in markdown and "| pass@2 | 75.0% |" in markdown
    assert "unknown_tool 4" in markdown and "infra-failed episodes (excluded from success rates): 2" in markdown
    assert pass_at_k_curve(record) == [(1, pytest.approx(0.625)), (2, pytest.approx(0.75))]
    png = plot_pass_at_k({"solver": record}, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_lookup_suite_uses_its_knowledge_base_in_process(tiny_model_dir, tokenizer, tmp_path):
    tasks = suite_tasks("calc,lookup", num_tasks=3, out_dir=tmp_path)
    kinds = ["right"] * 5 + ["wrong"]
    summary = await evaluate(tiny_model_dir, tasks, engine=SolverEngine(tokenizer, tasks, kinds), run_dir=tmp_path)
    assert summary["tool_error_rate"] == 0.0  # every lookup found its entity in the generated KB
    assert summary["by_data_source"]["lookup/heldout"]["pass@1"] == pytest.approx(2 / 3)
    assert summary["by_data_source"]["calc/heldout"]["pass@1"] == 1.0
    assert json.loads((tmp_path / EVAL_JSON).read_text())["settings"]["greedy"] is True
    assert "## lookup/heldout" in (tmp_path / EVAL_MD).read_text()


def test_sampling_defaults_and_refusals():
    assert resolve_temperature(None, 1) == 0.0 and resolve_temperature(None, 4) == 1.0
    assert resolve_temperature(0.7, 4) == 0.7
    with pytest.raises(ValueError, match="identical samples"):
        resolve_temperature(0.0, 4)
    assert default_ks(1) == [1] and default_ks(8) == [1, 2, 4, 8] and default_ks(5) == [1, 2, 4, 5]


async def test_bad_inputs_fail_before_any_rollout(tiny_model_dir, tmp_path):
    tasks = suite_tasks("calc", num_tasks=2)
    with pytest.raises(ValueError, match="pass@k must be in 1..n=2"):
        await evaluate(tiny_model_dir, tasks, n=2, ks=[4], engine=object())
    with pytest.raises(ValueError, match="neither a task file"):
        suite_tasks("calculus")
    code = suite_tasks("code", num_tasks=1)
    with pytest.raises(ValueError, match="unit_tests rewards, which run in the sandbox"):
        await evaluate(tiny_model_dir, code, engine=object())


async def test_compare_markdown_puts_two_runs_side_by_side(tiny_model_dir, tokenizer, tmp_path):
    tasks = suite_tasks("calc", num_tasks=4, out_dir=tmp_path / "data")
    for name, kinds in (("before", ["wrong", "wrong", "right", "right"]), ("after", ["right"] * 4)):
        await evaluate(tiny_model_dir, tasks, engine=SolverEngine(tokenizer, tasks, kinds), run_dir=tmp_path / name,
                       name=name)
    report = compare_markdown([load_eval(tmp_path / "before"), load_eval(tmp_path / "after")])
    assert "| metric | before | after |" in report
    assert "| pass@1 | 50.0% | 100.0% |" in report
    assert "before better on 0, after better on 2, tied on 2" in report
    assert "Warning" not in report


def test_cli_smoke_on_tiny_model_and_compare_with_finished_run(tiny_model_dir, tmp_path, capsys):
    """`agentrl eval` with the real LocalEngine on a tiny random model, then compare against another run."""
    from agentrl.cli import main

    out = tmp_path / "tiny"
    args = ["eval", "--model", str(tiny_model_dir), "--suite", "calc", "--num-tasks", "3", "--n", "2", "--out",
            str(out), "--name", "tiny", "-o", "agent.max_new_tokens_per_turn=8", "-o", "agent.max_assistant_turns=2"]
    assert main(args) == 0
    record = load_eval(out)
    assert record["summary"]["num_tasks"] == 3 and record["summary"]["num_episodes"] == 6
    assert record["settings"]["temperature"] == 1.0 and record["settings"]["ks"] == [1, 2]
    assert record["config"]["agent"]["max_new_tokens_per_turn"] == 8
    for name in ("tasks.jsonl", "episodes.jsonl", "pass_at_k.png"):
        assert (out / name).is_file(), name
    assert "| pass@1 |" in capsys.readouterr().out

    assert main(["eval", "--model", str(out), "--compare", str(out), "--compare-name", "again"]) == 0
    report = (out / "compare.md").read_text()
    assert "| metric | tiny | again |" in report and "tied on 3" in report
