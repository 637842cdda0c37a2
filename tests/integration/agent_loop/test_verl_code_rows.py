"""verl code rows (codecontests, apps, codeforces, taco) scored in the real sandbox: the share of the first 10
test cases passed, as verl's continuous sandbox score, through agentrl's stdin_stdout and unit_tests rewards."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import sandbox_service

from agentrl.agent_loop.config import RewardConfig
from agentrl.agent_loop.rewards import compute_reward
from agentrl.data.tasks import load_tasks
from agentrl.types import Episode

pytestmark = pytest.mark.slow

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ADD_BUT_NEGATIVES = "```python\na, b = map(int, input().split())\nprint(abs(a + b))\n```"  # wrong on 1 case of 4
CASES = {"inputs": ["1 2\n", "10 20\n", "-5 2\n", "0 0\n"], "outputs": ["3\n", "30\n", "-3\n", "0\n"]}


@pytest.fixture(scope="module")
def sandbox_url():
    with sandbox_service("max_concurrency=4") as url:
        yield url


def episode(final: str) -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": final}])


def code_rows(tmp_path):
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": "Read a and b; print a + b."}],
             "ability": "code", "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
             "extra_info": {"index": i, "split": "test"}}
            for i, (source, tests) in enumerate([
                ("codecontests", CASES),
                ("taco", {"inputs": [f"{n} 1\n" for n in range(12)], "outputs": [f"{n + 1}\n" for n in range(12)]}),
                ("apps", {"assert_case": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
                          "inputs": ["", ""], "outputs": [None, None]})])]
    path = tmp_path / "code.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return load_tasks(path)


async def test_code_rows_score_the_share_of_cases_passed(sandbox_url, tmp_path):
    stdin_task, many_task, assert_task = code_rows(tmp_path)
    cfg = RewardConfig(sandbox_url=sandbox_url, unit_tests_timeout_s=5.0)
    assert await compute_reward(stdin_task, episode(ADD), cfg) == 1.0
    wrong = episode(ADD_BUT_NEGATIVES)
    assert await compute_reward(stdin_task, wrong, cfg) == 0.75
    info = wrong.metrics["reward_info"]
    assert (info["passed"], info["total"]) == (3, 4) and info["cases"][2]["kind"] == "wrong_answer"
    # 12 cases: only the first 10 count; a program right on n < 5 only passes 5 of them
    half = "```python\nn, one = map(int, input().split())\nprint(n + one if n < 5 else 0)\n```"
    assert await compute_reward(many_task, episode(half), cfg) == 0.5
    add_fn = "```python\ndef add(a, b):\n    return a + b\n```"
    assert await compute_reward(assert_task, episode(add_fn), cfg) == 1.0
    cheat = "```python\nimport sys\ndef add(a, b):\n    sys.exit(0)\n```"  # the harness sees through the exit
    assert await compute_reward(assert_task, episode(cheat), cfg) == 0.0
