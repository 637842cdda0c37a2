"""A real small run for the viewer and replay tests: the tiny model, taught to call an in-process tool, rolled
out by RolloutManager into episodes.jsonl (two steps, groups of 2), with the trainer's records (advantages and
logprobs from a forward pass, written by `write_train_records`) and metrics.jsonl (MetricsLogger)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

QUESTIONS = ["Look up the key a.", "Look up the key b."]


async def lookup(key: str) -> str:
    """Look up a key in the table."""
    return f"the value of {key} is 42"


def _trainer_logprobs(model, episodes, pad_token_id: int):
    import torch

    from agentrl.trainer.batch import episodes_to_batch

    batch = episodes_to_batch(episodes, pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, batch["input_ids"][:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(len(episodes), 1), logp], dim=1)  # aligned with input_ids, as the trainer's


async def _record(model_dir: Path, run_dir: Path, model) -> None:
    import torch

    from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
    from agentrl.agent_loop.rollout import write_train_records
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine
    from agentrl.tools import ToolRegistry
    from agentrl.trainer.algos import grpo_advantages
    from agentrl.trainer.metrics import MetricsLogger, episode_metrics
    from agentrl.types import Task

    engine = LocalEngine.from_pretrained(model_dir, EngineConfig(max_model_len=1024))
    tools = ToolRegistry.from_functions([lookup])
    manager = RolloutManager(engine, engine.tokenizer, tools,
                             AgentLoopConfig(max_assistant_turns=3, max_new_tokens_per_turn=48,
                                             max_response_tokens=400),
                             RolloutConfig(n=2, temperature=1.0, seed=7, max_concurrent_episodes=4),
                             RewardConfig(), run_dir=run_dir)
    tasks = [Task(prompt=[{"role": "user", "content": q}], task_id=f"q{i}", data_source=f"source{i}",
                  reward={"type": "exact_match", "ground_truth": "42"}) for i, q in enumerate(QUESTIONS)]
    logger = MetricsLogger(run_dir, ["jsonl"])
    try:
        for step in (1, 2):
            episodes = await manager.generate(tasks, step=step)
            trained = [e for e in episodes if not e.infra_error]
            adv_B = grpo_advantages(torch.tensor([e.reward for e in trained]), [e.uid for e in trained])
            write_train_records(run_dir, step, trained, adv_B, _trainer_logprobs(model, trained,
                                                                                 engine.tokenizer.pad_token_id))
            logger.log(step, episode_metrics(trained))
    finally:
        logger.close()
        await engine.close()
        await tools.aclose()


@pytest.fixture(scope="session")
def recorded_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(run_dir, model_dir) of the small real run."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.agent_loop.bench import teach_tool_calls
    from agentrl.tools import ToolRegistry

    root = tmp_path_factory.mktemp("viewer-run")
    model_dir, run_dir = root / "model", root / "run"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    schemas = ToolRegistry.from_functions([lookup]).schemas()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss = teach_tool_calls(model, tokenizer, schemas, questions=QUESTIONS, turns=2, steps=100,
                                tool_name="lookup", arguments={"key": "a"}, turn_text="Looking.")
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.5, f"the tiny model did not learn the tool call (loss {loss:.3f})"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"path": str(model_dir)}}))
    asyncio.run(_record(model_dir, run_dir, model))
    return run_dir, model_dir


async def _evaluate(model_dir: Path, out: Path, name: str) -> None:
    from agentrl.agent_loop import AgentLoopConfig
    from agentrl.evaluation.run import evaluate
    from agentrl.inference.config import EngineConfig
    from agentrl.tools import ToolRegistry
    from agentrl.types import Task

    tools = ToolRegistry.from_functions([lookup])
    tasks = [Task(prompt=[{"role": "user", "content": q}], task_id=f"q{i}", data_source=f"source{i}",
                  reward={"type": "exact_match", "ground_truth": "42"}) for i, q in enumerate(QUESTIONS)]
    try:
        await evaluate(model_dir, tasks, n=2, seed=7, engine_config=EngineConfig(max_model_len=1024),
                       agent_config=AgentLoopConfig(max_assistant_turns=3, max_new_tokens_per_turn=48,
                                                    max_response_tokens=400),
                       tools=tools, run_dir=out, name=name, tasks_source="the viewer tests' two lookups")
    finally:
        await tools.aclose()


@pytest.fixture(scope="session")
def recorded_eval(recorded_run, tiny_model_dir, tmp_path_factory) -> Path:
    """An `agentrl eval` output directory of the small run's model (2 tasks x 2 samples) with the comparison
    `agentrl eval --compare` writes against the untaught tiny model's evaluation (compare.md, pass_at_k.png)."""
    import concurrent.futures
    import subprocess
    import sys

    _, model_dir = recorded_run
    root = tmp_path_factory.mktemp("viewer-eval")
    taught, untaught = root / "eval-taught", root / "eval-untaught"
    # a thread of its own: a test's sync Playwright keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _evaluate(model_dir, taught, "taught")).result()
        pool.submit(asyncio.run, _evaluate(tiny_model_dir, untaught, "untaught")).result()
    subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--model", str(taught), "--compare", str(untaught)],
                   check=True, capture_output=True, timeout=120)
    return taught
