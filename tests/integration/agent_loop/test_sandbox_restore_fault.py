"""The python tool's restore in real rollouts: a batch of multi-turn episodes through RolloutManager and the tool
agent loop, against a real sandbox service that is restarted on the same port mid-episode. Counted: episodes that
finish (right answer) thanks to the restore, and episodes lost (infra errors); with the tool's `restore: false`
the same fault loses them all.

The policy is scripted (fixed python calls, then an answer read off the last observation). The fault happens at
one event, never at a time: when every episode has made FAULT_AFTER calls and asks for its next turn, the service
is stopped and a new one started; then the episodes go on. Half the tasks fork a setup, half write a random token
(their replay writes another one, so the restore must lay the snapshot's file down and reports the divergence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import pytest
from helpers import free_port, service

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
from agentrl.tools import ToolRegistry
from agentrl.tools.builtin.python import python
from agentrl.types import Generation, Task

pytestmark = pytest.mark.slow

FAULT_AFTER = 2  # python calls each episode makes before the sandbox service is restarted
SETUP = "base = 100\nopen('setup.txt', 'w').write('prepared')"
N = 2  # episodes per task


def _calls(i: int, setup: bool, random: bool) -> list[str]:
    start = "base" if setup else "0"
    second = ("noise = os.urandom(4).hex()\nopen('out/total.txt', 'w').write(f'{sum(data)} {noise}')\nprint(noise)"
              if random else "open('out/total.txt', 'w').write(f'{sum(data)} fixed')")
    return [f"import os\nos.makedirs('out', exist_ok=True)\ndata = [{start} + {i} * k for k in range(5)]\n"
            "open('out/data.txt', 'w').write(repr(data))",
            second,
            "print(sum(data), open('out/total.txt').read(), open('setup.txt').read() if os.path.exists('setup.txt') "
            "else 'no setup')"]


KINDS = [(False, False), (False, True), (True, False), (True, True)]  # (forks a setup, writes a random token)
TASKS = [Task(prompt=[{"role": "user", "content": f"Task {i}: add up the data."}], tools=["python"], task_id=f"t{i}",
              tools_kwargs={"python": {"setup": SETUP}} if setup else {},
              reward={"type": "exact_match", "ground_truth": str(sum((100 if setup else 0) + i * k for k in range(5)))})
         for i, (setup, _) in enumerate(KINDS)]


class FaultPolicy:
    """An Engine whose turns are each task's python calls, then `<answer>` with the first number of the last
    observation. Before the turn that follows call FAULT_AFTER, an episode waits until every episode is there;
    the last to arrive runs `fault` once."""

    def __init__(self, tokenizer, episodes: int, fault):
        self.tokenizer = tokenizer
        self.episodes = episodes
        self.fault = fault
        self.arrived = 0
        self.released = asyncio.Event()

    async def generate(self, input_ids, params, *, session_id=None) -> Generation:
        text = self.tokenizer.decode(input_ids)
        i = int(re.search(r"Task (\d+):", text).group(1))
        done = text.count("<tool_response>")
        if done == FAULT_AFTER:
            self.arrived += 1
            if self.arrived == self.episodes:
                await self.fault()
                self.released.set()
            await self.released.wait()
        calls = _calls(i, *KINDS[i])
        if done < len(calls):
            turn = '<tool_call>\n{"name": "python", "arguments": {"code": %s}}\n</tool_call>' % json.dumps(calls[done])
        else:
            last = text.rsplit("<tool_response>\n", 1)[1]
            turn = f"<answer>{last.split()[0]}</answer>"
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = self.tokenizer.encode(turn, add_special_tokens=False) + [end]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    async def update_weights(self, weights, *, version=None) -> None:
        return None


class RestartableSandbox:
    """A sandbox service on a fixed port that `restart()` stops and starts again (it then knows no session)."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stack = contextlib.ExitStack()
        self.restarts = 0

    def _start(self) -> None:
        args = ["python", "-m", "sandbox", "serve", "--port", str(self.port), "--set", "max_sessions=16",
                "--set", "default_memory_mb=256"]
        self.stack.enter_context(service(args, f"{self.url}/v1/ping"))

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc):
        self.stack.close()

    async def restart(self) -> None:
        def again():
            self.stack.close()
            self._start()

        await asyncio.to_thread(again)
        self.restarts += 1


async def _rollout(qwen2_tokenizer_dir, tmp_path, restore: bool) -> list:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir)
    with RestartableSandbox() as sandbox:
        registry = ToolRegistry.from_functions([python], tools_kwargs={"python": {
            "sandbox_url": sandbox.url, "cell_timeout_s": 20, "restore": restore}})
        policy = FaultPolicy(tokenizer, len(TASKS) * N, sandbox.restart)
        manager = RolloutManager(policy, tokenizer, registry, AgentLoopConfig(max_assistant_turns=6,
                                                                              max_new_tokens_per_turn=512),
                                 RolloutConfig(n=N, temperature=0.0), RewardConfig(), run_dir=tmp_path)
        try:
            episodes = await manager.generate(TASKS)
        finally:
            await registry.aclose()
        assert sandbox.restarts == 1
    return episodes


def _counts(episodes) -> dict:
    def total(metric: str) -> int:
        return sum(call.get("metrics", {}).get(metric, 0) for e in episodes for call in e.tool_calls)

    return {"completed": sum(not e.infra_error and e.reward == 1.0 for e in episodes),
            "lost": sum(e.infra_error for e in episodes),
            "restored": total("sandbox_restored"), "diverged": total("restore_diverged"),
            "snapshots": total("workspace_snapshots")}


async def test_restore_saves_every_episode_whose_sandbox_restarted(qwen2_tokenizer_dir, tmp_path):
    episodes = await _rollout(qwen2_tokenizer_dir, tmp_path, restore=True)
    counts = _counts(episodes)
    # 8 episodes, all restored; the 4 with a random token replayed another one (diverged) and still read the
    # snapshot's file; a snapshot after each call that wrote files (2 an episode), none after the reading call
    assert counts == {"completed": 8, "lost": 0, "restored": 8, "diverged": 4, "snapshots": 16}, counts
    for episode in episodes:
        i = int(episode.task_id[1:])
        setup, random = KINDS[i]
        second, third = episode.tool_calls[1], episode.tool_calls[2]
        assert third["metrics"]["sandbox_restored"] == 1 and third["metrics"]["replayed_cells"] == 2
        assert third["metrics"]["restored_files"] == 2 + setup  # the fork's setup.txt is in the snapshot too
        observation = episode.messages[-2]["content"]  # the reading call's output, before the answer
        total = sum((100 if setup else 0) + i * k for k in range(5))
        token = second["response"]["content"] if random else "fixed"
        assert observation == f"{total} {total} {token} {'prepared' if setup else 'no setup'}", observation


async def test_without_restore_the_same_fault_loses_every_episode(qwen2_tokenizer_dir, tmp_path):
    episodes = await _rollout(qwen2_tokenizer_dir, tmp_path, restore=False)
    counts = _counts(episodes)
    assert counts == {"completed": 0, "lost": 8, "restored": 0, "diverged": 0, "snapshots": 0}, counts
    assert all("restore is off" in e.metrics["infra_detail"] for e in episodes)
