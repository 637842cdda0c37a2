"""`agentrl eval` against real HTTP tool services (`--serve-tools`, `serve_builtin_tools`), and compare mode
with a second model directory."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from agentrl.evaluation.cli import serve_builtin_tools
from agentrl.evaluation.run import evaluate, load_eval, suite_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "evaluation"))
from test_run import SolverEngine  # noqa: E402

pytestmark = pytest.mark.slow


async def test_http_tool_service_gives_the_same_results_as_in_process_tools(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from agentrl.tools.client import ToolRegistry
    from agentrl.tools.config import ServiceConfig, ToolsConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = suite_tasks("calc,lookup", num_tasks=3, out_dir=tmp_path / "data")
    kinds = ["right", "detour", "wrong", "right", "detour", "wrong"]
    local = await evaluate(tiny_model_dir, tasks, engine=SolverEngine(tokenizer, tasks, kinds), run_dir=tmp_path / "a")
    with serve_builtin_tools(["calculator", "lookup"]) as url:
        registry = ToolRegistry.from_tools_config(ToolsConfig(services=[ServiceConfig(url=url, name="eval-tools")]))
        try:
            remote = await evaluate(tiny_model_dir, tasks, engine=SolverEngine(tokenizer, tasks, kinds),
                                    tools=registry, run_dir=tmp_path / "b")
        finally:
            await registry.aclose()
    # lookup sessions carried each task's knowledge-base path over HTTP; only the scripted detours failed
    assert remote["tool_errors_by_kind"] == {"unknown_tool": 2}
    assert remote == local
    assert local["pass@1"] == pytest.approx(4 / 6)
    assert load_eval(tmp_path / "b")["config"]["tools"]["served_by"] == {"calculator": "eval-tools",
                                                                         "lookup": "eval-tools"}


def test_cli_serve_tools_and_compare_with_a_second_model(tiny_model_dir, tmp_path, capsys):
    from agentrl.cli import main

    twin = shutil.copytree(tiny_model_dir, tmp_path / "twin")
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_model_dir), "--suite", "calc,lookup", "--num-tasks", "1",
                 "--serve-tools", "--out", str(out), "--name", "base", "--compare", str(twin),
                 "-o", "agent.max_new_tokens_per_turn=8", "-o", "agent.max_assistant_turns=2"]) == 0
    first, second = load_eval(out), load_eval(out / "compare-twin")
    for record in (first, second):
        assert record["summary"]["num_tasks"] == 2
        assert set(record["config"]["tools"]["served_by"].values()) == {"eval-tools"}
    # greedy decoding of identical weights: identical per-task outcomes
    assert [t["answer"] for t in first["tasks"]] == [t["answer"] for t in second["tasks"]]
    report = (out / "compare.md").read_text()
    assert "| metric | base | twin |" in report and "tied on 2" in report and "## lookup/heldout" in report
    assert report in capsys.readouterr().out


def test_cli_serve_tools_replaces_the_tool_services_of_a_finished_runs_config(tiny_model_dir, tmp_path, capsys):
    """A training run's config.yaml names the tool services that ran with it; evaluating its checkpoints with that
    config and --serve-tools uses the served built-ins, and never contacts the stopped services."""
    from agentrl.cli import main
    from agentrl.services import free_port

    config = tmp_path / "config.yaml"
    config.write_text(f"tools:\n  services:\n  - {{url: 'http://127.0.0.1:{free_port()}', name: stopped}}\n"
                      "agent: {max_new_tokens_per_turn: 8, max_assistant_turns: 2}\n")
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_model_dir), "--suite", "calc,lookup", "--num-tasks", "1",
                 "--config", str(config), "--serve-tools", "--out", str(out)]) == 0
    record = load_eval(out)
    assert record["summary"]["num_tasks"] == 2 and record["summary"]["infra_failed_episodes"] == 0
    assert set(record["config"]["tools"]["served_by"].values()) == {"eval-tools"}
    # without --serve-tools the stopped service is the config's choice: one line naming it, before any rollout
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_model_dir), "--suite", "calc", "--num-tasks", "1",
                 "--config", str(config), "--out", str(tmp_path / "eval-2")]) != 0
    assert "tool service 'stopped'" in capsys.readouterr().err
    assert not (tmp_path / "eval-2" / "eval.json").exists()


def _bwrap_missing() -> str | None:
    import os

    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (make bwrap)"
    if os.geteuid() != 0:
        return "the sandbox's cgroup limits need root"
    return None


async def test_code_suite_runs_python_and_unit_tests_in_the_sandbox(tiny_model_dir, tmp_path):
    from helpers import free_port, service
    from transformers import AutoTokenizer

    from agentrl.agent_loop.config import RewardConfig

    if _bwrap_missing():
        pytest.skip(_bwrap_missing())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = suite_tasks("code", num_tasks=3, out_dir=tmp_path / "data")
    url = f"http://127.0.0.1:{free_port()}"
    with service(["python", "-m", "sandbox", "serve", "--port", url.rsplit(":", 1)[1]], f"{url}/v1/ping"):
        engine = SolverEngine(tokenizer, tasks, ["right", "wrong", "detour"])
        summary = await evaluate(tiny_model_dir, tasks, engine=engine, reward_config=RewardConfig(sandbox_url=url),
                                 run_dir=tmp_path / "run")
    # the python tool ran each draft in a sandbox session; the unit tests passed for the two right solutions
    assert summary["infra_failed_episodes"] == 0
    assert summary["pass@1"] == pytest.approx(2 / 3)
    assert summary["tool_errors_by_kind"] == {"unknown_tool": 1}
    record = load_eval(tmp_path / "run")
    assert record["config"]["tools"]["names"] == ["python"]
