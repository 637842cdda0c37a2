"""Procedural suites: determinism, split shift, held-out disjointness, ground truths, demos and the CLI."""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import re
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.data.suites import SUITES, make_suite, write_suite
from agentrl.data.suites import code as code_suite
from agentrl.data.suites.demos import make_demos

N = 200


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _tasks(suite: str, split: str, n: int = N, seed: int = 0, tmp: Path | None = None) -> list[dict]:
    return make_suite(suite, split, n, seed, kb_path=(tmp or Path("/nonexistent")) / f"{split}.kb.jsonl")[0]


def _user(task: dict) -> str:
    return task["prompt"][-1]["content"]


@pytest.mark.parametrize("suite", SUITES)
def test_same_seed_same_bytes_other_seed_other_tasks(suite, tmp_path):
    out = tmp_path / "t.jsonl"
    first = [p.read_bytes() for p in write_suite(suite, "train", 50, out, seed=3)]
    again = [p.read_bytes() for p in write_suite(suite, "train", 50, out, seed=3)]
    assert first == again
    other = write_suite(suite, "train", 50, out, seed=4)[0].read_bytes()
    assert other != first[0]


@pytest.mark.parametrize("suite", SUITES)
def test_rows_follow_the_task_format_and_heldout_never_appears_in_train(suite):
    train, heldout = _tasks(suite, "train"), _tasks(suite, "heldout")
    for split, rows in (("train", train), ("heldout", heldout)):
        assert len({r["task_id"] for r in rows}) == len(rows) == N
        for r in rows:
            assert [m["role"] for m in r["prompt"]] == ["system", "user"]
            assert r["data_source"] == f"{suite}/{split}"
            assert r["tools"] == {"calc": ["calculator"], "lookup": ["lookup"], "code": ["python"], "guess": []}[suite]
            assert r["task_id"].startswith(f"{suite}-{split}-")
            assert len(_user(r)) < 400, "prompts must stay short for a ~1-2k-token context"
    assert not {_user(r) for r in train} & {_user(r) for r in heldout}


def _operands(task: dict) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", _user(task))]


def test_calc_heldout_has_larger_numbers_longer_chains_and_other_people():
    train, heldout = _tasks("calc", "train"), _tasks("calc", "heldout")
    assert all(x < 10**5 for t in train + heldout for x in _operands(t)), "both splits stay within 5 digits"
    assert all(max(_operands(t)) >= 10**4 for t in heldout), "every held-out problem has a 5-digit operand"
    assert sum(max(_operands(t)) >= 10**4 for t in train) < 0.6 * len(train)

    def people(tasks):
        return {_user(t).split()[0] for t in tasks}

    assert not people(train) & people(heldout) and len(people(heldout)) >= 3
    share3 = [sum(t["extra"]["num_ops"] == 3 for t in rows) / len(rows) for rows in (train, heldout)]
    assert 0 < share3[0] < 0.15 < share3[1]  # three-operation chains: a few demonstrations, a fifth of held-out


def _safe_eval(expression: str) -> int:
    """An evaluator written for this test, independent of the suite and of the calculator tool."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def ev(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node.op, ast.Div):
            num, den = ev(node.left), ev(node.right)
            assert num % den == 0, f"{expression}: division must be exact"
            return num // den
        return ops[type(node.op)](ev(node.left), ev(node.right))

    return ev(ast.parse(expression, mode="eval").body)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_calc_ground_truth_is_the_value_of_the_numbers_in_the_question(split):
    for task in _tasks("calc", split):
        expression = task["extra"]["expression"]
        # The expression uses the question's numbers in the question's order: copying them is all it takes.
        assert [int(x) for x in re.findall(r"\d+", expression)] == _operands(task)
        value = _safe_eval(expression)
        assert value >= 0
        assert task["reward"] == {"type": "numeric", "ground_truth": str(value), "tolerance": 0.0}


def _kb(tmp_path: Path, split: str, n: int = N) -> tuple[list[dict], dict[str, dict]]:
    paths = write_suite("lookup", split, n, tmp_path / f"{split}.jsonl")
    kb = {row["entity"]: row["facts"] for row in _rows(paths[1])}
    return _rows(paths[0]), kb


def test_lookup_heldout_entities_are_unseen_and_mostly_two_hop(tmp_path):
    train, train_kb = _kb(tmp_path, "train")
    heldout, heldout_kb = _kb(tmp_path, "heldout")
    assert not set(train_kb) & set(heldout_kb)
    train_values = {v for facts in train_kb.values() for v in facts.values()}
    assert not train_values & set(heldout_kb), "no held-out entity is even mentioned in the train KB"

    def two_hop_share(tasks):
        return sum(len(t["extra"]["relations"]) == 2 for t in tasks) / len(tasks)

    assert two_hop_share(train) < 0.45 < 0.55 < two_hop_share(heldout)


def test_lookup_two_hop_questions_are_equally_likely(tmp_path):
    """A question whose entity would answer itself redraws the entity, not the question: once it redrew the
    question, so "Who manages the company X works for?" (rejected for half the people, who manage where they work)
    came half as often as "In which city is the company X works for?", and GRPO learnt to answer every such
    question with the city (docs/quickstart.md)."""
    tasks, _ = _kb(tmp_path, "heldout", n=2000)
    counts = {}
    for task in tasks:
        if len(task["extra"]["relations"]) == 2:
            key = "/".join(task["extra"]["relations"])
            counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 5
    assert max(counts.values()) < 1.25 * min(counts.values()), counts


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from agentrl.models.tiny import build_tokenizer
    return build_tokenizer()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_heldout_prompts_use_only_tokens_the_training_text_shows(seed, tiny_tokenizer, tmp_path):
    """Held-out questions are unseen combinations of familiar tokens: a token no training text contains keeps its
    random initial embedding, and what the trained model does with it is chance (one GRPO run answered 44 of 56
    held-out calc problems about "Hana", whose "Han" no training row had, without calling the tool). The training
    text is what the quickstart's SFT rows hold: the train questions of both suites and the lookup tool's responses
    (the train KB's rows)."""
    def tokens(texts):
        return {t for text in texts for t in tiny_tokenizer.tokenize(text)}

    trained: set[str] = set()
    for suite in ("calc", "lookup"):
        tasks, kb_rows = make_suite(suite, "train", 2000, seed, kb_path=tmp_path / "train.kb.jsonl")
        trained |= tokens(m["content"] for task in tasks for m in task["prompt"])
        trained |= tokens(json.dumps({"entity": row["entity"], **row["facts"]}) for row in kb_rows or [])
    for suite in ("calc", "lookup"):
        for task in _tasks(suite, "heldout", N, seed, tmp_path):
            unseen = tokens(m["content"] for m in task["prompt"]) - trained
            assert not unseen, f"{_user(task)!r}: {sorted(unseen)} occur in no training text"


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_lookup_ground_truth_follows_the_kb_file_from_the_entity_in_the_question(tmp_path, split):
    tasks, kb = _kb(tmp_path, split)
    kb_file = str((tmp_path / f"{split}.kb.jsonl").resolve())
    for task in tasks:
        assert task["tools_kwargs"] == {"lookup": {"kb_path": kb_file}}
        entity = task["extra"]["entity"]
        assert entity in _user(task)
        current = entity
        for relation in task["extra"]["relations"]:
            current = kb[current][relation]
        assert task["reward"] == {"type": "exact_match", "ground_truth": current}
        assert current not in _user(task)


def _run_tests(code: str, tests: str) -> bool:
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the suite's own reference solutions
    try:
        exec(tests, scope)  # noqa: S102
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_code_reference_solutions_pass_the_unit_tests_and_wrong_ones_fail(split):
    tasks = _tasks("code", split, n=100)
    for task in tasks:
        reward, extra = task["reward"], task["extra"]
        assert reward["type"] == "unit_tests"
        assert f"{reward['entry_point']}(xs)" in _user(task)
        assert _run_tests(extra["solution"], reward["tests"]), task["task_id"]
        # The tests discriminate: a function that ignores the pipeline's last step fails them.
        body = extra["solution"].splitlines()
        wrong = "\n".join(body[:-1] + ["    return None"])
        assert not _run_tests(wrong, reward["tests"])
    steps = [t["extra"]["num_steps"] for t in tasks]
    assert (min(steps), max(steps)) == ((0, 3) if split == "train" else (1, 3))


def test_code_function_names_are_disjoint_between_splits():
    train = {t["reward"]["entry_point"] for t in _tasks("code", "train")}
    heldout = {t["reward"]["entry_point"] for t in _tasks("code", "heldout")}
    assert train and heldout and not train & heldout


def _final_answer(messages: list[dict]) -> str:
    return re.fullmatch(r"(?:.*\n)?<answer>(.*)</answer>", messages[-1]["content"]).group(1)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_calc_and_lookup_demos_reach_the_truth_through_the_real_tools(tmp_path, split):
    from agentrl.tools.builtin.calculator import calculator
    from agentrl.tools.builtin.lookup import format_facts

    calc = _tasks("calc", split, n=30)
    lookup, kb = _kb(tmp_path, split, n=30)
    rows = asyncio.run(make_demos(calc + lookup))
    assert [r["task_id"] for r in rows] == [t["task_id"] for t in calc + lookup]
    for task, row in zip(calc + lookup, rows):
        messages = row["messages"]
        assert messages[:2] == task["prompt"]
        assert _final_answer(messages) == task["reward"]["ground_truth"]
        calls = [m for m in messages if m.get("tool_calls")]
        results = [m for m in messages if m["role"] == "tool"]
        assert len(calls) == len(results) == (1 if task in calc else len(task["extra"]["relations"]))
        for call, result in zip(calls, results):
            fn = call["tool_calls"][0]["function"]
            if fn["name"] == "calculator":
                assert result["content"] == calculator(**fn["arguments"])
                assert fn["arguments"]["expression"] == " " + task["extra"]["expression"]
            else:
                assert result["content"] == format_facts(fn["arguments"]["entity"], kb[fn["arguments"]["entity"]])
        assert [s["function"]["name"] for s in row["tools"]] == task["tools"]
        if task in lookup:
            # the first turn names the relations to follow; every turn after a response quotes the fact it
            # follows, exactly as the response shows it
            turns = [m for m in messages if m["role"] == "assistant"]
            relations = task["extra"]["relations"]
            facts = [f'"{rel}": "{value}"' for rel, value in zip(relations, task["extra"]["chain"])]
            assert turns[0]["content"] == "Follow " + ", then ".join(f'"{rel}"' for rel in relations) + "."
            assert [turn["content"] for turn in turns[1:-1]] == facts[:-1]
            assert turns[-1]["content"].startswith(facts[-1] + "\n<answer>")
            assert all(fact in result["content"] for fact, result in zip(facts, results))
        elif task in calc:
            assert messages[-1]["content"].startswith("<answer>")


def test_code_demos_test_the_solution_on_the_example_then_answer_it():
    tasks = _tasks("code", "heldout", n=8)
    rows = asyncio.run(make_demos(tasks))  # no sandbox: the python call is simulated locally
    for task, row in zip(tasks, rows):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        code = row["messages"][2]["tool_calls"][0]["function"]["arguments"]["code"]
        assert code.startswith(task["extra"]["solution"]) and "print(" in code
        assert row["messages"][3]["content"] == str(task["extra"]["expected"])
        final = row["messages"][4]["content"]
        assert final == f"```python\n{task['extra']['solution']}\n```"
        assert _run_tests(final.removeprefix("```python\n").removesuffix("\n```"), task["reward"]["tests"])
        assert [s["function"]["name"] for s in row["tools"]] == ["python"]


def test_code_demos_with_comments_answer_the_commented_solution():
    tasks = _tasks("code", "heldout", n=8)
    rows = asyncio.run(make_demos(tasks, code_test_call=False, code_comments=True))
    for task, row in zip(tasks, rows):
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        assert row["messages"][-1]["content"] == f"```python\n{task['extra']['commented_solution']}\n```"


@pytest.mark.parametrize("suite", SUITES)
def test_cli_make_writes_rows_that_load_as_tasks(suite, tmp_path, capsys):
    from agentrl.data.tasks import load_tasks

    out = tmp_path / f"{suite}.jsonl"
    assert main(["data", "make", suite, "--split", "heldout", "--n", "20", str(out), "--seed", "1"]) == 0
    assert f"wrote 20 {suite}/heldout tasks" in capsys.readouterr().out
    tasks = load_tasks(out)
    assert [t.task_id for t in tasks] == [r["task_id"] for r in _rows(out)]
    for task in tasks:
        assert task.data_source == f"{suite}/heldout" and task.tools == _tasks(suite, "heldout", 1)[0]["tools"]
        assert task.prompt[-1]["role"] == "user" and task.reward["type"] and task.extra
    if suite == "lookup":
        kb_path = tasks[0].tools_kwargs["lookup"]["kb_path"]
        assert kb_path == str((tmp_path / "lookup.kb.jsonl").resolve()) and Path(kb_path).is_file()


def test_cli_demos_writes_sft_rows_and_their_tasks(tmp_path, capsys):
    demos = tmp_path / "sft.jsonl"
    assert main(["data", "demos", "calc", "--n", "10", str(demos)]) == 0
    rows = _rows(demos)
    assert len(rows) == 10 and all(r["messages"][-1]["content"].startswith("<answer>") for r in rows)
    assert "wrote 10 calc/train demonstrations" in capsys.readouterr().out
    # The tasks file beside the demos loads as Tasks, and solving the loaded Tasks gives the same transcripts.
    from agentrl.data.tasks import load_tasks

    tasks = load_tasks(tmp_path / "sft.tasks.jsonl")
    assert [r["messages"] for r in asyncio.run(make_demos(tasks))] == [r["messages"] for r in rows]


def test_a_demo_that_disagrees_with_the_ground_truth_is_refused():
    from agentrl.data.suites.demos import DemoError

    task = _tasks("calc", "train", n=1)[0]
    task["reward"]["ground_truth"] = str(int(task["reward"]["ground_truth"]) + 1)
    with pytest.raises(DemoError, match="calculator"):
        asyncio.run(make_demos([task]))


def test_hard_mix_keeps_train_numbers_and_names_with_more_multi_step_problems(tmp_path):
    """The RL mix of the train split: more multi-operation (calc: up to three, each problem with a 5-digit
    operand) and two-hop problems, nothing of the held-out split."""
    calc_plain, calc_hard = _tasks("calc", "train"), make_suite("calc", "train", 200, 0, hard=True)[0]
    first = [t["extra"]["operands"][0] for t in calc_hard]  # later ones may be divisors or cut to stay positive
    assert 100 <= min(first) and max(x for t in calc_hard for x in t["extra"]["operands"]) < 100_000
    assert all(max(t["extra"]["operands"]) >= 10_000 for t in calc_hard)
    share = [sum(t["extra"]["num_ops"] >= 2 for t in rows) / len(rows) for rows in (calc_plain, calc_hard)]
    assert share[0] < 0.5 < 0.75 < share[1]
    assert {t["extra"]["num_ops"] for t in calc_hard} == {1, 2, 3}
    share3 = [sum(t["extra"]["num_ops"] == 3 for t in rows) / len(rows) for rows in (calc_plain, calc_hard)]
    assert share3[0] < 0.15 < 0.25 < share3[1]  # few three-operation demonstrations, many in the RL mix
    assert not {t["task_id"] for t in calc_hard} & {t["task_id"] for t in _tasks("calc", "heldout")}
    # op_weights reweights the chain lengths alone (the hard mix's digits and 5-digit operand stay)
    calc_long = make_suite("calc", "train", 200, 0, hard=True, calc_op_weights=(0, 0, 1))[0]
    assert {t["extra"]["num_ops"] for t in calc_long} == {3}
    assert all(max(t["extra"]["operands"]) >= 10_000 for t in calc_long)

    kb = tmp_path / "hard.kb.jsonl"
    lookup_hard, kb_rows = make_suite("lookup", "train", 200, 0, kb_path=kb, hard=True)
    heldout_names = {r["entity"] for r in make_suite("lookup", "heldout", 200, 0, kb_path=tmp_path / "h.kb")[1]}
    assert not {r["entity"] for r in kb_rows} & heldout_names
    assert sum(len(t["extra"]["relations"]) == 2 for t in lookup_hard) / len(lookup_hard) > 0.55
    assert {t["data_source"] for t in calc_hard + lookup_hard} == {"calc/train", "lookup/train"}


def test_code_hard_mix_has_three_step_pipelines_with_train_names_only():
    """The code RL mix: mostly 3-step pipelines (one SFT demonstration in fifty) with train names; the held-out
    split keeps its unseen names, so it still differs from everything trained on."""
    plain, hard = _tasks("code", "train", n=400), make_suite("code", "train", 200, 0, hard=True)[0]
    heldout = _tasks("code", "heldout", n=200)
    assert {t["extra"]["num_steps"] for t in plain} == {0, 1, 2, 3}
    assert {t["extra"]["num_steps"] for t in hard} == {1, 2, 3}
    share3 = [sum(t["extra"]["num_steps"] == 3 for t in rows) / len(rows) for rows in (plain, hard)]
    assert 0.005 < share3[0] < 0.05 and 0.4 < share3[1]
    names = {split: {t["reward"]["entry_point"] for t in rows}
             for split, rows in (("plain", plain), ("hard", hard), ("heldout", heldout))}
    assert names["hard"] <= set(code_suite.function_names("train")) and not names["hard"] & names["heldout"]
    assert {t["data_source"] for t in hard} == {"code/train"}
    assert all(_run_tests(t["extra"]["solution"], t["reward"]["tests"]) for t in hard)


def _without_line(solution: str, i: int) -> str:
    lines = solution.splitlines()
    return "\n".join(lines[:1 + i] + lines[2 + i:])


def test_code_hard_mix_rewards_no_program_that_skips_a_step():
    """RL tasks: the program without any one of its lines fails the unit tests ("sorts the numbers" before "their
    sum" is never drawn for RL), at the declared pipeline lengths; the plain train split keeps such tasks."""
    hard = make_suite("code", "train", 400, 0, hard=True)[0]
    for task in hard:
        solution, tests = task["extra"]["solution"], task["reward"]["tests"]
        for i in range(task["extra"]["num_steps"]):
            assert not _run_tests(_without_line(solution, i), tests), (task["task_id"], i)
    shares = [sum(t["extra"]["num_steps"] == k for t in hard) / len(hard) for k in (1, 2, 3)]
    assert abs(shares[0] - 0.15) < 0.06 and abs(shares[1] - 0.35) < 0.08 and abs(shares[2] - 0.5) < 0.08
    plain = _tasks("code", "train", n=200)
    assert any(_run_tests(_without_line(t["extra"]["solution"], i), t["reward"]["tests"])
               for t in plain for i in range(t["extra"]["num_steps"]))
    step = code_suite.Step("sort", "sorts the numbers", "xs = sorted(xs)", sorted)
    task = code_suite.CodeTask("f", [step], code_suite.REDUCERS[0])  # sorted, then the sum: the sort never matters
    assert not code_suite.every_step_matters(task, [[3, 1, 2], []])


def test_code_commented_solution_restates_each_phrase_above_its_line():
    for task in _tasks("code", "heldout", n=50):
        extra = task["extra"]
        lines = extra["commented_solution"].splitlines()
        assert [ln for ln in lines if not ln.lstrip().startswith("#")] == extra["solution"].splitlines()
        comments = [ln.strip().removeprefix("# ") for ln in lines if ln.lstrip().startswith("#")]
        assert len(comments) == extra["num_steps"] + 1 and comments[-1].startswith("returns ")
        for number, phrase in enumerate(comments[:-1], 1):
            assert phrase.startswith(f"({number}) ") and phrase in _user(task), "the prompt's numbered phrase"
        assert f"and returns {comments[-1].removeprefix('returns ')}. Example" in _user(task)
        assert _run_tests(extra["commented_solution"], task["reward"]["tests"])


@pytest.mark.parametrize("suite,split", [("calc", "heldout"), ("lookup", "heldout"), ("code", "heldout")])
def test_hard_mix_exists_only_for_the_train_split(suite, split, tmp_path):
    from agentrl.errors import UserError

    with pytest.raises(UserError, match="hard") as info:  # a user's mistake: one line from the CLI
        make_suite(suite, split, 5, 0, kb_path=tmp_path / "kb.jsonl", hard=True)
    assert isinstance(info.value, ValueError) and "--hard" in str(info.value)


def test_cli_make_hard(tmp_path, capsys):
    out = tmp_path / "calc-rl.jsonl"
    assert main(["data", "make", "calc", "--split", "train", "--hard", "--n", "30", str(out)]) == 0
    assert "wrote 30 calc/train (hard mix) tasks" in capsys.readouterr().out
    assert len(_rows(out)) == 30


@pytest.mark.parametrize("suite", ["calc", "lookup"])
def test_system_prompt_never_shows_the_answer_tags_literally(suite):
    """A literal `<answer>N</answer>` in the prompt puts the tokens that precede the answer's value in front of
    "N", so an in-context copy head copies "N" instead of the tool's value: with the copy-circuit init of seed 1
    SFT never left that trap (docs/log.md, 2026-12-02, 86dae1e).
    The format is said in words; the demonstrations show it."""
    task = _tasks(suite, "train", n=5)[0]
    system = next(m["content"] for m in task["prompt"] if m["role"] == "system")
    assert "<answer>" not in system and "</answer>" not in system
    assert "answer tags" in system


def test_guess_games_hold_out_whole_ranges_and_binary_search_solves_every_one():
    from agentrl.data.suites.demos import make_demos

    train, heldout = _tasks("guess", "train", 300), _tasks("guess", "heldout", 100)
    ranges = {split: {(t["extra"]["low"], t["extra"]["high"]) for t in rows}
              for split, rows in (("train", train), ("heldout", heldout))}
    assert not ranges["train"] & ranges["heldout"] and len(ranges["heldout"]) > 10
    for t in train + heldout:
        assert t["env"]["name"] == "guess_number" and t["env"]["kwargs"]["secret"] == t["extra"]["secret"]
    rows = asyncio.run(make_demos(heldout))
    for task, row in zip(heldout, rows):  # every game solved within its guesses, the last answer the secret
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert answers[-1] == f"<answer>{task['extra']['secret']}</answer>"
        assert len(answers) <= task["env"]["kwargs"]["max_guesses"] and row["tools"] == []
