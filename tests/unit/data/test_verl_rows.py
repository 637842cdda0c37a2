"""Rows in verl's preprocessing format, written to parquet, loaded by the task loader and scored as verl scores
them (expected scores derived by hand from verl's gsm8k, math_reward, math_dapo and search-R1 rules)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl.agent_loop.config import CustomRewardFunctionConfig, RewardConfig
from agentrl.agent_loop.rewards import RewardSpecError, check_reward_specs, compute_reward
from agentrl.config import ConfigError, load_config
from agentrl.data.tasks import TaskFormatError, load_tasks
from agentrl.preflight import check_rewards, read_task_files
from agentrl.trainer.config import TrainConfig
from agentrl.types import Episode

GSM8K_ASK = ' Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
MATH_ASK = " Let's think step by step and output the final answer within \\boxed{}."  # verl's math_dataset.py

# (data_source, question, ground_truth, response, verl's score)
TABLE = [
    ("openai/gsm8k", "Tom has 3 bags of 24 apples. How many?", "72", "3 * 24 = 72\n#### 72", 1.0),
    ("openai/gsm8k", "Tom has 3 bags of 24 apples. How many?", "72", "3 * 24 = 70\n#### 70", 0.0),
    ("openai/gsm8k", "Tom has 3 bags of 24 apples. How many?", "72", "<answer>72</answer>", 0.0),
    ("openai/gsm8k", "A car costs $1,200 more. Total?", "3400", "2200 + 1200 = 3400\n#### 3,400", 1.0),
    ("DigitalLearningGmbH/MATH-lighteval", "What is 1/2 + 1/4?", "\\frac{3}{4}", "So \\boxed{\\dfrac34}.", 1.0),
    ("DigitalLearningGmbH/MATH-lighteval", "What is 1/2 + 1/4?", "\\frac{3}{4}", "So \\boxed{0.75}.", 0.0),
    ("lighteval/MATH", "Solve 2x = 10.", "5", "x = 5, so \\boxed{x = 5}", 1.0),
    ("HuggingFaceH4/MATH-500", "Angle?", "90", "\\boxed{90^\\circ}", 1.0),
    ("HuggingFaceH4/MATH-500", "Angle?", "90", "The angle is 90 degrees.", 0.0),
    ("math_dapo", "Compute 6 * 7.", "42", "6 * 7 = 42\nAnswer: 42", 1.0),
    ("math_dapo", "Compute 6 * 7.", "42", "6 * 7 = 43\nAnswer: 43", -1.0),
    ("math_dapo", "Compute 6 * 7.", "42", "It is 42.", -1.0),  # no "Answer:" line
    ("aime2024", "Find the remainder.", "117", "answer: $117$", 1.0),
    ("math", "How many dollars?", "1000", "Answer: 1,000 dollars", 1.0),
]


def verl_row(index: int, source: str, question: str, truth, split: str = "test") -> dict:
    """A row as verl's examples/data_preprocess scripts write it."""
    ask = GSM8K_ASK if source == "openai/gsm8k" else MATH_ASK
    return {"data_source": source, "prompt": [{"role": "user", "content": question + ask}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": index}}


def episode(final: str, finish_reason: str = "stop") -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": final}],
                   finish_reason=finish_reason)


def write_parquet(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


async def test_verl_rows_score_as_verl_scores_them(tmp_path):
    path = write_parquet(tmp_path / "test.parquet",
                         [verl_row(i, source, q, truth) for i, (source, q, truth, _, _) in enumerate(TABLE)])
    tasks = load_tasks(path)
    assert [t.data_source for t in tasks] == [row[0] for row in TABLE]
    assert tasks[0].reward == {"type": "verl", "ground_truth": "72", "data_source": "openai/gsm8k"}
    check_reward_specs(tasks, RewardConfig())
    scores = [await compute_reward(task, episode(row[3]), RewardConfig()) for task, row in zip(tasks, TABLE)]
    assert scores == [row[4] for row in TABLE]


async def test_dapo_keeps_acc_and_pred_and_an_unfinished_answer_scores_as_an_empty_one(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", [verl_row(0, "math_dapo", "6*7?", "42"),
                                                   verl_row(1, "openai/gsm8k", "6*7?", "42")])
    dapo, gsm8k = load_tasks(path)
    ep = episode("Answer: 42")
    assert await compute_reward(dapo, ep, RewardConfig()) == 1.0
    assert ep.metrics["reward_info"] == {"score": 1.0, "acc": True, "pred": "42"}
    # cut at the length limit: no finished answer, scored as an empty response (DAPO's -1, GSM8K's 0) ...
    cut = episode("Answer: 42", finish_reason="length")
    assert await compute_reward(dapo, cut, RewardConfig()) == -1.0 and cut.metrics["reward_info"]["acc"] is False
    assert await compute_reward(gsm8k, episode("#### 42", finish_reason="length"), RewardConfig()) == 0.0
    # ... unless reward.score_unfinished
    assert await compute_reward(dapo, cut, RewardConfig(score_unfinished=True)) == 1.0


async def test_search_r1_rows(tmp_path):
    rows = [{"data_source": "searchR1_nq", "prompt": [{"role": "user", "content": "Where is the Eiffel Tower?"}],
             "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris"]}},
             "extra_info": {"index": 0, "split": "test", "need_tools_kwargs": True,
                            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": ["Paris"]}}}}}}]
    (task,) = load_tasks(write_parquet(tmp_path / "search.parquet", rows))
    assert task.tools == ["search"]
    assert await compute_reward(task, episode("<answer> paris. </answer>"), RewardConfig()) == 1.0
    assert await compute_reward(task, episode("<answer>Lyon</answer>"), RewardConfig()) == 0.0
    assert await compute_reward(task, episode("Paris"), RewardConfig()) == 0.0


def test_an_unknown_data_source_is_one_line_naming_it_and_the_fixes(tmp_path):
    path = write_parquet(tmp_path / "mine.parquet", [verl_row(0, "openai/gsm8k", "q", "1"),
                                                      verl_row(1, "my_qa", "q", "Paris"),
                                                      verl_row(2, "numina_olympiads", "q", "3")])
    files, problems = read_task_files([path], "data.train_files")  # what `agentrl train` checks before it starts
    assert problems == []
    lines = check_rewards(files, RewardConfig())
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith(f"{path}:row 2: data_source 'my_qa' has no verl score")
    assert lines[1].startswith(f"{path}:row 3: verl scores data_source 'numina_olympiads' with its prime_math scorer")
    assert all("reward.verl_reward_type=TYPE" in line and "reward.custom_reward_function.path=FILE.py" in line
               for line in lines)
    with pytest.raises(RewardSpecError, match="data_source 'my_qa'"):
        check_reward_specs(load_tasks(path), RewardConfig())


async def test_verl_reward_type_from_a_config_file_and_the_command_line(tmp_path):
    path = write_parquet(tmp_path / "mine.parquet", [verl_row(0, "my_qa", "Capital of France?", "Paris")])
    config = tmp_path / "train.yaml"
    config.write_text("reward:\n  verl_reward_type: exact_match\n")
    from_file = load_config(TrainConfig, config).reward
    from_cli = load_config(TrainConfig, overrides=["reward.verl_reward_type=exact_match"]).reward
    files, _ = read_task_files([path], "data.train_files")
    assert check_rewards(files, from_file) == [] and check_rewards(files, from_cli) == []
    (task,) = load_tasks(path)
    assert await compute_reward(task, episode("<answer>paris</answer>"), from_cli) == 1.0
    typo = load_config(TrainConfig, overrides=["reward.verl_reward_type=exact_mach"]).reward
    (line,) = check_rewards(files, typo)
    assert "(reward.verl_reward_type): unknown reward type 'exact_mach'" in line


CUSTOM = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    right = solution_str.strip().endswith(ground_truth)
    return {"score": float(right) + bonus, "acc": right, "seen": [data_source, extra_info["index"],
                                                                 extra_info["num_turns"]]}


async def length_score(data_source, solution_str, ground_truth, extra_info):
    return len(solution_str)
'''


async def test_custom_reward_function_path_and_name(tmp_path):
    (tmp_path / "my_reward.py").write_text(CUSTOM)
    path = write_parquet(tmp_path / "mine.parquet", [verl_row(7, "my_qa", "Capital of France?", "Paris")])
    (task,) = load_tasks(path)
    config = tmp_path / "train.yaml"
    config.write_text(f"reward:\n  custom_reward_function:\n    path: {tmp_path / 'my_reward.py'}\n"
                      "    reward_kwargs: {bonus: 0.5}\n")
    reward = load_config(TrainConfig, config).reward
    files, _ = read_task_files([path], "data.train_files")
    assert check_rewards(files, reward) == []  # a custom function scores any data_source
    ep = episode("It is Paris")
    ep.num_turns = 2
    assert await compute_reward(task, ep, reward) == 1.5
    assert ep.metrics["reward_info"] == {"score": 1.5, "acc": True, "seen": ["my_qa", 7, 2]}
    by_name = load_config(TrainConfig, config, ["reward.custom_reward_function.name=length_score",
                                                "reward.custom_reward_function.reward_kwargs={}"]).reward
    assert await compute_reward(task, episode("abc"), by_name) == 3.0  # async functions are awaited


def test_custom_reward_function_mistakes_fail_at_config_load(tmp_path):
    (tmp_path / "my_reward.py").write_text(CUSTOM + "\ndef two(a, b):\n    return 0\n")
    file = tmp_path / "my_reward.py"
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function: path .*nope.py does not exist"):
        load_config(TrainConfig, overrides=[f"reward.custom_reward_function.path={tmp_path / 'nope.py'}"])
    with pytest.raises(ConfigError, match="defines no function 'score'; set reward.custom_reward_function.name"):
        load_config(TrainConfig, overrides=[f"reward.custom_reward_function.path={file}",
                                            "reward.custom_reward_function.name=score"])
    with pytest.raises(ConfigError, match=r"two in .* must accept \(data_source, solution_str, ground_truth, extra"):
        CustomRewardFunctionConfig(path=str(file), name="two")


def test_a_reward_model_row_is_refused_at_load(tmp_path):
    row = verl_row(0, "openai/gsm8k", "q", "1")
    row["reward_model"]["style"] = "model"
    with pytest.raises(TaskFormatError, match=r"row 1: verl field 'reward_model.style' is 'model'; agentrl scores"):
        load_tasks(write_parquet(tmp_path / "rm.parquet", [row]))


def code_row(tests: str) -> dict:
    return {"data_source": "codecontests", "prompt": [{"role": "user", "content": "Add two numbers."}],
            "ability": "code", "reward_model": {"style": "rule", "ground_truth": tests}, "extra_info": {"index": 0}}


async def test_code_rows_need_a_sandbox_and_supported_tests(tmp_path):
    path = write_parquet(tmp_path / "code.parquet", [
        code_row('{"inputs": ["1 2\\n"], "outputs": ["3\\n"]}'),
        code_row('{"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}'),
        code_row('{"inputs": ["1 2\\n"], "outputs": []}'), code_row("not json")])
    files, _ = read_task_files([path], "data.train_files")
    lines = check_rewards(files, RewardConfig(sandbox_url="http://127.0.0.1:9"))
    assert [line.split(": ")[0] for line in lines] == [f"{path}:row {n}" for n in (2, 3, 4)]
    assert "call-based code tests (fn_name 'add') are not supported" in lines[0]
    assert "'inputs' and 'outputs' lists of the same, non-zero length" in lines[1]
    assert "code ground_truth is not JSON" in lines[2]
    (line, *_) = check_rewards(files, RewardConfig())
    assert line.startswith(f"{path}:row 1: data_source 'codecontests' is scored by running the answer's code in the "
                           "sandbox, but reward.sandbox_url is not set")
    task = load_tasks(path)[0]
    ep = episode("print(sum(map(int, input().split())))")  # no fenced block: 0, and the sandbox is never called
    assert await compute_reward(task, ep, RewardConfig(sandbox_url="http://127.0.0.1:9")) == 0.0
    assert ep.metrics["reward_info"]["error"] == "no fenced code block"
