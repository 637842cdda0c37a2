"""The openenv adapter against a real OpenEnv server (openenv-core's server package, uvicorn on a loopback port)
through openenv-core's own client: episodes run through EnvAgentLoop with the server's rewards; a server that is
not there is an infrastructure fault, not a reward of 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import free_port, service

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
from agentrl.envs.loop import EnvAgentLoop
from agentrl.types import Generation, Task

pytest.importorskip("openenv")  # the envs extra; `make setup` installs it
pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def echo_server():
    port = free_port()
    with service(["python", "-m", "uvicorn", "openenv_echo_server:app", "--host", "127.0.0.1", "--port", str(port)],
                 f"http://127.0.0.1:{port}/health", env={"PYTHONPATH": str(HERE)}):
        yield f"http://127.0.0.1:{port}"


class TextEngine:
    """Answers every turn with one fixed text and the end-of-turn token."""

    def __init__(self, tokenizer, text: str):
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def generate(self, input_ids, params):
        return Generation(list(self.ids), [-0.25] * len(self.ids), "stop")


def echo_task(url: str) -> Task:
    return Task(prompt=[{"role": "system", "content": "Echo game."}], reward={"type": "env"}, task_id="echo",
                env={"name": "openenv", "kwargs": {"base_url": url, "observation_field": "echoed_message",
                                                   "reset_kwargs": {"seed": 7}}})


async def test_episodes_against_an_openenv_server(echo_server, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    manager = RolloutManager(TextEngine(tokenizer, "hello"), tokenizer, None, AgentLoopConfig(), RolloutConfig(n=3),
                             RewardConfig())
    episodes = await manager.generate([echo_task(echo_server)])
    for episode in episodes:  # three sessions at once, each its own environment on the server
        assert not episode.infra_error and episode.metrics["stop_detail"] == "env_done"
        assert episode.turn_rewards == pytest.approx([0.5, 0.5]) and episode.reward == pytest.approx(1.0)
        assert [m["content"] for m in episode.messages] == ["Echo game.", "Say anything (seed 7).", "hello",
                                                            "You said: hello", "hello"]
        assert episode.turns[0]["env"]["info"] == {"observation": {"echoed_message": "You said: hello"}}
        episode.check()


async def test_an_unreachable_server_is_an_infra_fault(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loop = EnvAgentLoop(TextEngine(tokenizer, "hello"), tokenizer, AgentLoopConfig())
    episode = await loop.run(echo_task(f"http://127.0.0.1:{free_port()}"))
    assert episode.infra_error and episode.metrics["stop_detail"] == "env_error"
    assert "reset raised ConnectionError" in episode.metrics["infra_detail"]
