"""The quickstart pipeline end to end in miniature: every phase runs for real and every service stops."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_smoke_quickstart_runs_every_phase_and_stops_its_services(tmp_path):
    run_dir = tmp_path / "qs"
    run_dir.mkdir()
    (run_dir / "report.md").write_text("an earlier run")
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "quickstart", "--smoke", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for phase in range(1, 9):
        assert f"[{phase}/8]" in out
    # the earlier run was moved aside, not appended to
    assert f"{run_dir} holds an earlier quickstart: moved it to {tmp_path / 'qs.old-1'}" in out
    assert (tmp_path / "qs.old-1" / "report.md").read_text() == "an earlier run"
    # a log reads like a terminal: our first lines and progress lines, no bars, colours or third-party notices
    assert "sft: run dir " in out and "train: run dir " in out and "eval after SFT: " in out
    assert "\r" not in out and "\x1b[" not in out
    assert "Loading weights" not in out and "Token authentication" not in out
    report = (run_dir / "report.md").read_text()
    assert "| metric | after SFT | after GRPO |" in report and "## calc/heldout" in report
    assert "**This is a smoke run**" in report and "- agentrl commit: " in report and "## Time per phase" in report
    assert (run_dir / "curves.png").stat().st_size > 10_000
    before = json.loads((run_dir / "eval-sft" / "eval.json").read_text())
    after = json.loads((run_dir / "eval-grpo" / "eval.json").read_text())
    assert before["settings"] == after["settings"]  # same sampling for the before/after comparison
    assert before["summary"]["num_tasks"] == after["summary"]["num_tasks"] == 16
    # the same tasks sampled at the rollouts' temperature, 2 samples each, before and after
    before_s = json.loads((run_dir / "eval-sft-sampled" / "eval.json").read_text())
    after_s = json.loads((run_dir / "eval-grpo-sampled" / "eval.json").read_text())
    assert before_s["settings"] == after_s["settings"] and before_s["settings"]["temperature"] == 0.7
    assert before_s["summary"]["num_episodes"] == 32 and "pass@2" in after_s["summary"]
    assert "## Greedy and sampled (T=0.7, 2 samples per task)" in report
    metrics = [json.loads(line) for line in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "actor/pg_loss" in m] == [1, 2]
    # the tool service and the sandbox were shut down
    port = int(re.search(r"tools at http://127.0.0.1:(\d+)", out).group(1))
    assert not _listening(port)


def test_taken_port_is_a_clear_error(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "quickstart", "--smoke", "--no-sandbox",
                               "--tools-port", str(port), "--run-dir", str(tmp_path / "qs")],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken" in proc.stderr


def test_code_smoke_quickstart_runs_code_only_in_the_sandbox(tmp_path):
    """`--suites code --smoke`: demos graded in the sandbox, the python tool served over HTTP on the sandbox,
    unit-test rewards in the sandbox for both evaluations and GRPO; every service stops."""
    import yaml

    run_dir = tmp_path / "qs-code"
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "quickstart", "--suites", "code", "--smoke",
                           "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for phase in range(1, 9):
        assert f"[{phase}/8]" in out
    tools_port, sandbox_url = re.search(r"tools at http://127.0.0.1:(\d+), sandbox at (http://127.0.0.1:\d+) "
                                        r"\(isolation: ([^)]+)\)", out).group(1, 2)
    assert "(isolation: bwrap" in out or "(isolation: docker" in out
    assert "3 tools: calculator, lookup, python" in (run_dir / "logs" / "tools.log").read_text()
    report = (run_dir / "report.md").read_text()
    assert "data:\n  suites:\n  - code\n" in report and "| tasks | 8 | 8 |" in report
    heldout = [json.loads(line) for line in (run_dir / "data" / "heldout" / "tasks.jsonl").read_text().splitlines()]
    assert {row["data_source"] for row in heldout} == {"code/heldout"}
    demos = [json.loads(line) for line in (run_dir / "data" / "sft.jsonl").read_text().splitlines()]
    assert len(demos) == 16 and all(row["data_source"] == "code/train" for row in demos)
    for name in ("eval-sft", "eval-grpo"):
        record = json.loads((run_dir / name / "eval.json").read_text())
        assert record["config"]["reward"]["sandbox_url"] == sandbox_url
        assert record["summary"]["num_tasks"] == 8 and record["infra_failures"]["count"] == 0
    grpo = yaml.safe_load((run_dir / "grpo" / "config.yaml").read_text())
    assert grpo["reward"]["sandbox_url"] == sandbox_url and grpo["trainer"]["max_infra_failed_fraction"] < 1.0
    metrics = [json.loads(line) for line in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "actor/pg_loss" in m] == [1, 2]
    assert sum(m.get("data/infra_failed", 0) for m in metrics) == 0
    assert not _listening(int(tools_port)) and not _listening(int(sandbox_url.rsplit(":", 1)[1]))
