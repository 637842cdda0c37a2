"""The code suite's SFT demonstrations through the real sandbox: the python call runs in a sandbox session, the
final code passes the task's unit tests under the reward's harness, and a solution that fails is refused."""

from __future__ import annotations

import asyncio
import copy

import pytest
from helpers import free_port, sandbox_service

from agentrl.agent_loop.code_tests import run_unit_tests
from agentrl.data.suites import make_suite
from agentrl.data.suites.demos import DemoError, DemoToolUnavailableError, make_demos

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sandbox_url():
    with sandbox_service("max_concurrency=2") as url:
        yield url


def _final_code(row: dict) -> str:
    return row["messages"][-1]["content"].removeprefix("```python\n").removesuffix("\n```")


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_code_demos_run_in_the_sandbox_and_their_final_code_passes_the_unit_tests(sandbox_url, split):
    tasks, _ = make_suite("code", split, 12, seed=3)
    rows = asyncio.run(make_demos(tasks, sandbox_url=sandbox_url))
    assert [r["task_id"] for r in rows] == [t["task_id"] for t in tasks]
    # the sandbox's output is what the simulated call shows: the transcripts do not depend on where they ran
    assert rows == asyncio.run(make_demos(tasks))

    async def grade():
        return [await run_unit_tests(sandbox_url, _final_code(row), task["reward"]["tests"])
                for task, row in zip(tasks, rows)]

    reports = asyncio.run(grade())
    assert [r.kind for r in reports] == ["passed"] * len(tasks)


def test_a_reference_solution_whose_sandbox_output_disagrees_is_refused(sandbox_url):
    tasks, _ = make_suite("code", "train", 4, seed=0)
    task = next(t for t in tasks if t["extra"]["num_steps"] > 0)
    broken = copy.deepcopy(task)
    # drop the pipeline's first step: what the sandbox prints is no longer the task's expected value
    lines = broken["extra"]["solution"].splitlines()
    broken["extra"]["solution"] = "\n".join([lines[0], *lines[2:]])
    if broken["extra"]["solution"] != task["extra"]["solution"]:
        broken["extra"]["expected"] = "not what it prints"
    with pytest.raises(DemoError, match="printed"):
        asyncio.run(make_demos([broken], sandbox_url=sandbox_url))


def test_the_unit_test_check_alone_refuses_a_wrong_solution(sandbox_url):
    from agentrl.data.suites.demos import verify_unit_tests

    tasks, _ = make_suite("code", "heldout", 2, seed=0)
    task = tasks[0]
    asyncio.run(verify_unit_tests(task, task["extra"]["solution"], sandbox_url))
    wrong = task["extra"]["solution"].rsplit("\n", 1)[0] + "\n    return None"
    with pytest.raises(DemoError, match="fails its unit tests in the sandbox"):
        asyncio.run(verify_unit_tests(task, wrong, sandbox_url))


def test_a_sandbox_that_is_down_is_an_error_not_a_local_run():
    tasks, _ = make_suite("code", "train", 2, seed=0)
    with pytest.raises(DemoToolUnavailableError):
        asyncio.run(make_demos(tasks, sandbox_url=f"http://127.0.0.1:{free_port()}"))


def test_code_demos_without_the_test_call_answer_at_once_and_are_still_graded(sandbox_url):
    tasks, _ = make_suite("code", "train", 6, seed=1)
    rows = asyncio.run(make_demos(tasks, sandbox_url=sandbox_url, code_test_call=False))
    for task, row in zip(tasks, rows):
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        assert _final_code(row) == task["extra"]["solution"]
        assert [s["function"]["name"] for s in row["tools"]] == ["python"]  # the tool is still offered
    broken = copy.deepcopy(tasks[0])
    broken["extra"]["solution"] = broken["extra"]["solution"].rsplit("\n", 1)[0] + "\n    return None"
    with pytest.raises(DemoError, match="fails its unit tests in the sandbox"):
        asyncio.run(make_demos([broken], sandbox_url=sandbox_url, code_test_call=False))


def test_commented_code_demos_are_graded_in_the_sandbox(sandbox_url):
    tasks, _ = make_suite("code", "train", 4, seed=2)
    rows = asyncio.run(make_demos(tasks, sandbox_url=sandbox_url, code_test_call=True, code_comments=True))
    for task, row in zip(tasks, rows):
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert _final_code(row) == task["extra"]["commented_solution"]
    broken = copy.deepcopy(tasks[0])
    code = broken["extra"]["commented_solution"]
    broken["extra"]["commented_solution"] = code.rsplit("\n", 1)[0] + "\n    return None"
    with pytest.raises(DemoError, match="fails its unit tests in the sandbox"):
        asyncio.run(make_demos([broken], sandbox_url=sandbox_url, code_test_call=False, code_comments=True))
