"""The examples/ launchers: configs load, scripts parse, the calc example runs end to end, the code_sandbox
example's tool and reward wiring reaches a real sandbox, and the GPU launcher resolves its config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from helpers import REPO_ROOT, free_port, service

from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig

pytestmark = pytest.mark.slow

EXAMPLES = REPO_ROOT / "examples"
CPU_EXAMPLES = {"calc": ["calculator"], "lookup": ["lookup"], "code_sandbox": ["python"]}
RUN_SCRIPTS = sorted(EXAMPLES.glob("*/run.sh")) + sorted(EXAMPLES.glob("*.sh"))  # + shared pipelines


@pytest.mark.parametrize("name", sorted(CPU_EXAMPLES))
def test_cpu_example_config_loads(name):
    cfg = load_config(TrainConfig, EXAMPLES / name / "config.yaml")
    assert cfg.engine.backend == "local"
    assert cfg.tools.builtin == CPU_EXAMPLES[name]
    assert cfg.trainer.run_dir == f"runs/examples/{name}/rl"
    assert all(f"runs/examples/{name}/data/" in f for f in cfg.data.train_files + cfg.data.val_files)
    assert cfg.actor.clip_ratio_high == 0.28 and cfg.actor.use_kl_loss


def test_every_run_script_parses():
    assert {p.parent.name for p in RUN_SCRIPTS} >= {*CPU_EXAMPLES, "qwen2.5-3b-sglang"}
    for script in RUN_SCRIPTS:
        text = script.read_text()
        assert "set -euo pipefail" in text, f"{script} must fail fast"
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, f"{script}: {out.stderr}"


def test_gpu_example_resolves_its_config(tmp_path):
    """DRY_RUN prints the launch commands and resolves the exact `agentrl train` command line (no GPU needed)."""
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "MODEL_PATH": str(tmp_path / "model")}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # skip the download step
    out = subprocess.run(["bash", str(EXAMPLES / "qwen2.5-3b-sglang" / "run.sh")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("sglang.launch_server") == 4
    assert "ray start --head --num-gpus 4" in out.stdout
    cfg = yaml.safe_load(out.stdout.split("== resolved config:\n", 1)[1])
    assert cfg["engine"]["backend"] == "sglang"
    assert cfg["engine"]["urls"] == [f"http://127.0.0.1:{30000 + i}" for i in range(4)]
    assert cfg["actor"]["world_size"] == 4 and cfg["actor"]["num_gpus_per_worker"] == 1
    assert cfg["model"]["mixed_precision"] == "bfloat16" and cfg["actor"]["clip_ratio_high"] == 0.28
    assert cfg["tools"]["services"][0]["url"] == "http://127.0.0.1:8001"
    assert cfg["data"]["train_files"] == [f"{tmp_path}/data/calc-train.jsonl"]
    # the servers ask for a key, written once (mode 600), passed to SGLang in a --config file, sent by the trainer
    assert out.stdout.count("--config API_KEY_CONFIG") == 4
    assert cfg["engine"]["token_file"] == str(tmp_path / "engine.token")
    assert (tmp_path / "engine.token").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "engine.token").read_text().strip() not in out.stdout


def test_calc_example_runs_end_to_end(tmp_path, tiny_model_dir):
    """examples/calc/run.sh from another cwd: data -> GRPO step -> final_model -> held-out eval."""
    out_dir = tmp_path / "calc"
    shutil.copytree(tiny_model_dir, out_dir / "base-model")  # the script's `init-model` output, built once per session
    env = {**os.environ, "STEPS": "1", "N_TRAIN": "4", "N_EVAL": "2", "SFT_STEPS": "0", "TEST_FREQ": "0",
           "BATCH": "2", "GROUP": "2", "COMPARE": "0", "OUT": str(out_dir)}
    out = subprocess.run(["bash", str(EXAMPLES / "calc" / "run.sh"), "agent.max_new_tokens_per_turn=16"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    rows = [json.loads(line) for line in (out_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert "reward/mean" in rows[0] and rows[0]["data/infra_failed"] == 0
    assert (out_dir / "rl" / "final_model" / "config.json").is_file()
    summary = json.loads((out_dir / "eval" / "eval.json").read_text())
    assert len(summary["tasks"]) == 2
    assert "pass@1" in (out_dir / "eval" / "eval.md").read_text()


async def test_code_sandbox_wiring_reaches_the_sandbox(tmp_path):
    """The overrides run.sh passes make the example's python tool and unit-test reward use a real sandbox."""
    from agentrl.agent_loop.rewards import compute_reward
    from agentrl.data.suites import write_suite
    from agentrl.data.tasks import load_tasks
    from agentrl.tools.client import ToolRegistry
    from agentrl.types import Episode

    script = (EXAMPLES / "code_sandbox" / "run.sh").read_text()
    overrides = ["tools.tools_kwargs.python.sandbox_url=", "reward.sandbox_url="]
    assert all(o in script for o in overrides)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service([sys.executable, "-m", "agentrl.cli", "sandbox", "serve", "--port", str(port)], f"{url}/v1/ping"):
        cfg = load_config(TrainConfig, EXAMPLES / "code_sandbox" / "config.yaml", [o + url for o in overrides])
        registry = ToolRegistry.from_tools_config(cfg.tools)
        try:
            async with registry.episode_session() as session:
                first = await registry.call("python", {"code": "x = 6 * 7"}, session=session)
                second = await registry.call("python", {"code": "print(x)"}, session=session)
        finally:
            await registry.aclose()
        assert not first.is_error and not second.is_error, (first, second)
        assert second.content.strip() == "42"  # state persisted across calls in one sandbox session

        path = write_suite("code", "heldout", 1, tmp_path / "code.jsonl", seed=0)[0]
        row = json.loads(path.read_text())
        task = load_tasks(path)[0]

        def answered(code: str) -> Episode:
            return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                           messages=[{"role": "assistant", "content": f"```python\n{code}\n```"}])

        assert await compute_reward(task, answered(row["extra"]["solution"]), cfg.reward) == 1.0
        wrong = row["extra"]["solution"].replace("return ", "return None and ", 1)
        assert await compute_reward(task, answered(wrong), cfg.reward) == 0.0
