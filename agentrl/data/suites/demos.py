"""Scripted solvers: a correct OpenAI-format transcript for every suite task, for the SFT cold start.

A transcript is system + user (the task's prompt), then per tool call an assistant message with `tool_calls`
and a `tool` message with the tool's real output, then a final assistant message with the answer:

- calc:   calculator(" " + expression) once; answer `<answer>{the result's value}</answer>`. The leading space
          makes every operand follow the token it follows in the question (numbers tokenize as " ", digits), so
          the first operand is copied like the others; written right after the JSON quote, its first digit has
          nothing in the question to match, and the tiny model often never learns it (docs/benchmarks.md).
- lookup: lookup(entity) once per hop, the second hop on the value the first response showed; answer
          `<answer>{value}</answer>`. The first turn names the relations it will follow, in order (`Follow
          "works_at", then "based_in".`), while the question is a few tokens back; each later turn first quotes
          the fact it follows, exactly as the response shows it (`"based_in": "Lomira"`), then calls or answers.
          Which relation to follow is then a token the model writes (and GRPO can reinforce) instead of a choice
          hidden in the first token of a copied value; a 2-layer model confused the two facts of a record
          without it (docs/log.md, 2026-12-03, 45b746b).
- guess:  no tools: binary search played against the real `guess_number` environment, one
          `<answer>{midpoint}</answer>` per turn, each followed by the environment's answer, until it says solved.
- code:   python(code = solution + a print of the prompt's example) once; answer the solution in a ```python
          block. With `sandbox_url` the call goes to the real python tool (a sandbox interpreter session) and the
          final code is then graded by the task's own unit tests in the sandbox (`run_unit_tests`, the harness the
          `unit_tests` reward uses): a demonstration whose code does not pass is an error, not a row. Without a
          sandbox the call is *simulated*: the code runs locally in a subprocess (`python -I`, 10 s limit) and its
          output is rendered by the python tool's own formatter (`sandbox.client.cell_to_text`), so the
          transcript is the same either way for these programs (they only print); no unit tests run then. It is
          our own generated solution, never model output. The quickstart always uses the sandbox.
          `code_test_call=False`: no python call, the answer straight away (graded the same way); the tool stays
          offered. A third of the tokens and one sandbox process per episode instead of two.
          `code_comments=True`: the code restates each phrase of the task as a comment above its line.

calculator and lookup outputs come from the real builtin tools, called through `ToolRegistry` exactly as the
agent loop calls them (lookup reads the task's KB through tools_kwargs). Every transcript is checked before it
is written: the tool's output must contain the expected value, and the final answer must equal the ground truth,
so a disagreement between a suite and a tool fails loudly instead of teaching the model a wrong answer.

SFT rows: {"messages": [...], "tools": [OpenAI function schemas], "task_id": str, "data_source": str}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

from agentrl.data.suites import SUITE_TOOLS, check_suite, default_kb_path, write_suite
from agentrl.data.suites.common import write_jsonl
from agentrl.errors import UserError
from agentrl.tools.builtin.calculator import result_value
from agentrl.tools.builtin.lookup import format_fact
from agentrl.types import Task

PYTHON_RUN_TIMEOUT_S = 10.0


class DemoError(RuntimeError):
    """A scripted solver could not produce a verified transcript (a suite/tool disagreement: a bug to fix)."""


class DemoToolUnavailableError(UserError):
    """A tool the demonstrations call could not run for an infrastructure reason (e.g. the sandbox is down)."""


def _call_message(name: str, arguments: dict, content: str = "") -> dict:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _tool_message(name: str, content: str) -> dict:
    return {"role": "tool", "name": name, "content": content}


def _answer_message(text: str) -> dict:
    return {"role": "assistant", "content": text}


async def _call(tools, name: str, arguments: dict, session: str | None, task: dict) -> str:
    result = await tools.call(name, arguments, session=session)
    if result.infra_error:
        raise DemoToolUnavailableError(f"tool {name} could not run ({result.error_kind}: {result.content[:200]}); "
                                       "start the service it needs (the python tool: the sandbox given by "
                                       "--sandbox-url) or drop --sandbox-url to simulate the python calls")
    if result.is_error:
        raise DemoError(f"task {task['task_id']}: {name}({arguments}) failed ({result.error_kind}): "
                        f"{result.content[:300]}")
    return result.content


def _as_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        return None


async def solve_calc(task: dict, tools) -> list[dict]:
    expression = " " + task["extra"]["expression"]  # see the module docstring
    truth = Decimal(task["reward"]["ground_truth"])
    async with tools.episode_session(task["tools_kwargs"]) as session:
        output = await _call(tools, "calculator", {"expression": expression}, session, task)
    try:
        text = result_value(output)
    except (ValueError, KeyError, TypeError):
        text = ""
    value = _as_number(text)
    if value is None or value != truth:
        raise DemoError(f"task {task['task_id']}: calculator({expression!r}) returned {output!r}, expected "
                        f"{truth} (the suite's ground truth)")
    return [*task["prompt"], _call_message("calculator", {"expression": expression}),
            _tool_message("calculator", output), _answer_message(f"<answer>{text}</answer>")]


def plan_text(relations: list[str]) -> str:
    """The first lookup turn's plan: `Follow "works_at", then "based_in".`"""
    return "Follow " + ", then ".join(f'"{relation}"' for relation in relations) + "."


async def solve_lookup(task: dict, tools) -> list[dict]:
    extra = task["extra"]
    messages = list(task["prompt"])
    entity = extra["entity"]
    # what the next turn writes before its call or answer: first the plan, then the fact the last response showed
    # and the next turn follows, as the response wrote it
    quote = plan_text(extra["relations"])
    async with tools.episode_session(task["tools_kwargs"]) as session:
        for relation, value in zip(extra["relations"], extra["chain"]):
            output = await _call(tools, "lookup", {"entity": entity}, session, task)
            fact = format_fact(relation, value)  # '"based_in": "Lomira"', as the response writes it
            if fact not in output:
                raise DemoError(f"task {task['task_id']}: lookup({entity!r}) returned {output[:300]!r}, which "
                                f"does not show {relation} = {value!r} (is tools_kwargs.lookup.kb_path the KB "
                                f"written with these tasks?)")
            messages += [_call_message("lookup", {"entity": entity}, quote), _tool_message("lookup", output)]
            quote = fact
            entity = value
    if entity != task["reward"]["ground_truth"]:
        raise DemoError(f"task {task['task_id']}: the hop chain ends at {entity!r}, ground truth is "
                        f"{task['reward']['ground_truth']!r}")
    return messages + [_answer_message(f"{quote}\n<answer>{entity}</answer>")]


def run_python_locally(code: str) -> str:
    """Run a reference solution in a fresh isolated interpreter; show its output as the python tool shows a cell
    (`sandbox.client.cell_to_text`). Reference solutions never fail; if one does, that is a suite bug."""
    from sandbox.client import cell_to_text

    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          timeout=PYTHON_RUN_TIMEOUT_S)
    if proc.returncode != 0:
        raise DemoError(f"a reference solution failed (exit code {proc.returncode}):\n{code}\n{proc.stderr[-2000:]}")
    return cell_to_text({"status": "ok", "stdout": proc.stdout, "stderr": proc.stderr})


async def verify_unit_tests(task: dict, code: str, sandbox_url: str) -> None:
    """The task's unit tests must pass on `code` in the sandbox (the reward's harness); raises DemoError if not,
    DemoToolUnavailableError when the sandbox cannot run it."""
    from agentrl.agent_loop.code_tests import run_unit_tests
    from sandbox.client import SandboxInfraError

    try:
        report = await run_unit_tests(sandbox_url, code, task["reward"]["tests"])
    except SandboxInfraError as e:
        raise DemoToolUnavailableError(f"the sandbox at {sandbox_url} could not grade a demonstration ({e})") from None
    if report.reward != 1.0:
        raise DemoError(f"task {task['task_id']}: the reference solution fails its unit tests in the sandbox "
                        f"({report.kind}: {report.failed_test or ''} {report.error or ''}):\n{code}")


async def solve_code(task: dict, tools, *, sandbox_url: str | None = None, test_call: bool = True,
                     comments: bool = False) -> list[dict]:
    """With a `python` tool in `tools` (a sandbox is configured) the call is real; otherwise it is simulated.
    With `sandbox_url` the final code is also graded by the task's unit tests in that sandbox. `test_call=False`:
    answer without trying the code first. `comments`: the code restates each phrase of the task as a comment
    above its line (the task row's `extra.commented_solution`)."""
    extra = task["extra"]
    entry = task["reward"]["entry_point"]
    solution = extra["commented_solution"] if comments else extra["solution"]
    answer = _answer_message(f"```python\n{solution}\n```")
    if not test_call:
        if sandbox_url is not None:
            await verify_unit_tests(task, solution, sandbox_url)
        return [*task["prompt"], answer]
    probe = f"{solution}\nprint({entry}({extra['example']!r}))"
    if "python" in tools.names():
        async with tools.episode_session(task["tools_kwargs"]) as session:
            output = await _call(tools, "python", {"code": probe}, session, task)
    else:
        output = await asyncio.to_thread(run_python_locally, probe)
    if output.strip() != str(extra["expected"]):
        raise DemoError(f"task {task['task_id']}: the reference solution printed {output[:300]!r} on the example, "
                        f"expected {extra['expected']!r}")
    if sandbox_url is not None:
        await verify_unit_tests(task, solution, sandbox_url)
    return [*task["prompt"], _call_message("python", {"code": probe}), _tool_message("python", output), answer]


async def solve_guess(task: dict, tools) -> list[dict]:
    from agentrl.data.suites.guess import binary_search
    from agentrl.envs.guess_number import GuessNumberEnv

    env = GuessNumberEnv(**task["env"]["kwargs"])
    messages = await env.reset(Task(prompt=task["prompt"]))
    low, high, secret = (task["extra"][k] for k in ("low", "high", "secret"))
    for guess in binary_search(low, high, secret):
        answer = _answer_message(f"<answer>{guess}</answer>")
        result = await env.step(answer)
        messages += [answer, *result.observation]
        if result.done:
            if result.reward != 1.0 or result.observation:
                raise DemoError(f"guess task {task['task_id']}: binary search ran out of guesses at {guess}")
            return messages
    raise DemoError(f"guess task {task['task_id']}: the environment never said solved")


SOLVERS = {"calc": solve_calc, "lookup": solve_lookup, "guess": solve_guess}  # code also takes the sandbox


def suite_of(task: dict) -> str:
    suite = task["data_source"].split("/")[0]
    check_suite(suite)
    if not task.get("extra"):
        raise DemoError(f"task {task.get('task_id')!r} has no 'extra' facts: demos need tasks written by "
                        "agentrl.data.suites (agentrl data make), not arbitrary task files")
    return suite


def _as_row(task: dict | Task) -> dict:
    return dataclasses.asdict(task) if isinstance(task, Task) else task


async def solve(task: dict | Task, tools, *, sandbox_url: str | None = None, code_test_call: bool = True,
                code_comments: bool = False) -> list[dict]:
    """The verified transcript (OpenAI messages) solving one suite task (a row or a loaded `Task`), with tool
    outputs from `tools` (a ToolRegistry); `sandbox_url`: grade code tasks' final code by their unit tests there;
    `code_test_call`: whether code transcripts try the code with the python tool before answering;
    `code_comments`: whether their code restates each phrase of the task as a comment above its line."""
    task = _as_row(task)
    suite = suite_of(task)
    if suite == "code":
        return await solve_code(task, tools, sandbox_url=sandbox_url, test_call=code_test_call,
                                comments=code_comments)
    return await SOLVERS[suite](task, tools)


def demo_tools(sandbox_url: str | None = None):
    """An in-process ToolRegistry with the builtin calculator and lookup tools, plus the python tool on the
    sandbox at `sandbox_url` when given (without it, code demos simulate the python call locally)."""
    from agentrl.tools.builtin import builtin_tools
    from agentrl.tools.client import ToolRegistry

    if sandbox_url is None:
        return ToolRegistry.from_functions(builtin_tools(["calculator", "lookup"]))
    return ToolRegistry.from_functions(builtin_tools(["calculator", "lookup", "python"]),
                                       tools_kwargs={"python": {"sandbox_url": sandbox_url}})


def tool_schemas(suite: str) -> list[dict]:
    """The OpenAI schemas of the suite's tools, as the agent loop shows them to the model."""
    from agentrl.tools.builtin import builtin_tool

    return [builtin_tool(name).schema() for name in SUITE_TOOLS[suite]]


async def make_demos(tasks: list[dict] | list[Task], tools=None, *, sandbox_url: str | None = None,
                     concurrency: int = 4, code_test_call: bool = True, code_comments: bool = False) -> list[dict]:
    """SFT rows for `tasks` (any mix of suites), in task order. `tools`: a started ToolRegistry with the suites'
    tools (default: `demo_tools(sandbox_url)`, closed on return). With `sandbox_url`, code tasks' python calls
    run in that sandbox and their final code must pass the task's unit tests there. `concurrency`: tasks solved
    at once (the rows are the same whatever it is); `code_test_call`, `code_comments`: see `solve`."""
    own = tools is None
    tools = demo_tools(sandbox_url) if own else tools
    slots = asyncio.Semaphore(max(1, concurrency))

    async def row(task: dict) -> dict:
        suite = suite_of(task)
        async with slots:
            messages = await solve(task, tools, sandbox_url=sandbox_url, code_test_call=code_test_call,
                                   code_comments=code_comments)
        return {"messages": messages, "tools": tool_schemas(suite), "task_id": task["task_id"],
                "data_source": task["data_source"]}

    try:
        return list(await asyncio.gather(*(row(task) for task in map(_as_row, tasks))))
    finally:
        if own:
            await tools.aclose()


def write_demos(suite: str, n: int, out: str | Path, *, seed: int = 0, split: str = "train",
                kb_path: str | Path | None = None, sandbox_url: str | None = None) -> list[Path]:
    """Generate `n` tasks of `suite`/`split` and write their demonstrations to `out`.

    The tasks themselves go to OUT.tasks.jsonl (and the lookup KB, which the transcripts' tool outputs come from,
    to OUT.kb.jsonl or `kb_path`). Returns the paths written.
    """
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    tasks_path = out.with_name(stem + ".tasks.jsonl")
    written = write_suite(suite, split, n, tasks_path, seed=seed, kb_path=kb_path or default_kb_path(out))
    tasks = [json.loads(line) for line in tasks_path.read_text(encoding="utf-8").splitlines()]
    write_jsonl(out, asyncio.run(make_demos(tasks, sandbox_url=sandbox_url)))
    return [out, *written]
