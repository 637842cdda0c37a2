from __future__ import annotations

import asyncio

import pytest
from scripted_engine import ScriptedEngine, model_turn

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager, rollout_metrics
from agentrl.agent_loop.rewards import RewardError, RewardSpecError
from agentrl.agent_loop.rollout import read_episodes
from agentrl.tools.errors import UnknownToolError
from agentrl.types import Episode, Task


def tasks() -> list[Task]:
    return [Task(prompt=[{"role": "user", "content": f"What is {i}+{i}?"}], tools=["add"], task_id=f"t{i}",
                 reward={"type": "numeric", "ground_truth": str(2 * i)}) for i in range(3)]


class CountingEngine(ScriptedEngine):
    """Tracks how many generate calls are in flight at once."""

    in_flight: int = 0
    peak: int = 0

    async def generate(self, input_ids, params, *, session_id=None):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            return await super().generate(input_ids, params, session_id=session_id)
        finally:
            self.in_flight -= 1


def answer_from_prompt(input_ids, params, tokenizer):
    text = tokenizer.decode(input_ids)
    i = int(text.split("What is ")[1].split("+")[0])
    return f"<answer>{2 * i}</answer>"


async def test_groups_order_rewards_concurrency_and_dump(tiny_tokenizer, registry, tmp_path):
    script = [model_turn("", [("add", {"a": 1, "b": 1})]),
              lambda ids, params: answer_from_prompt(ids, params, tiny_tokenizer)]
    engine = CountingEngine(tiny_tokenizer, script)
    manager = RolloutManager(engine, tiny_tokenizer, registry, AgentLoopConfig(),
                             RolloutConfig(n=4, max_concurrent_episodes=3, seed=1), RewardConfig(), run_dir=tmp_path)
    episodes = await manager.generate(tasks(), step=5)
    assert len(episodes) == 12
    assert [e.task_id for e in episodes] == [f"t{i}" for i in range(3) for _ in range(4)]
    assert [e.metrics["sample_index"] for e in episodes] == [0, 1, 2, 3] * 3
    assert len({e.uid for e in episodes}) == 3 and len({e.uid for e in episodes[:4]}) == 1
    assert all(e.reward == 1.0 and e.num_turns == 2 and not e.infra_error for e in episodes)
    assert engine.peak == 3  # the pool was used fully and never exceeded
    assert len({c.session_id for c in engine.calls}) == 12  # one engine session per episode

    rows = read_episodes(tmp_path / "episodes.jsonl")
    assert len(rows) == 12 and {r["step"] for r in rows} == {5}
    assert [r["sample_index"] for r in rows[:4]] == [0, 1, 2, 3]
    again = Episode.from_dict({k: v for k, v in rows[0].items() if k not in ("step", "sample_index")})
    assert again.response_ids == episodes[0].response_ids and again.tool_calls == episodes[0].tool_calls
    assert again.response_logprobs == episodes[0].response_logprobs

    refill = await manager.generate(tasks()[:1], step=5, n=2)  # a second call in the same step: new groups
    assert refill[0].uid not in {e.uid for e in episodes}
    assert len(read_episodes(tmp_path / "episodes.jsonl")) == 14  # appended, not overwritten

    m = rollout_metrics(episodes)
    assert m["rollout/reward_mean"] == 1.0 and m["rollout/finish_stop"] == 1.0 and m["rollout/turns_mean"] == 2.0


async def test_a_raising_reward_stops_the_rollout_with_one_line_naming_it(tiny_tokenizer, registry):
    engine = ScriptedEngine(tiny_tokenizer, ["<answer>2</answer>"])
    manager = RolloutManager(engine, tiny_tokenizer, registry, AgentLoopConfig(), RolloutConfig(n=2),
                             RewardConfig())
    task = Task(prompt=[{"role": "user", "content": "q"}], task_id="t7",
                reward={"type": "tests_reward_fns:raising_reward"})
    with pytest.raises(RewardError) as raised:  # not an ExceptionGroup: the user's error itself
        await manager.generate([task])
    assert str(raised.value).startswith("reward 'tests_reward_fns:raising_reward' raised RuntimeError: grader "
                                        "crashed (tests_reward_fns.py:18) on task 't7'; fix the reward function")
    assert isinstance(raised.value.__cause__, RuntimeError)


@pytest.mark.parametrize("mode", ["zero", "drop"])
async def test_on_error_zero_or_drop_scores_zero_and_keeps_the_error(tiny_tokenizer, registry, mode):
    engine = ScriptedEngine(tiny_tokenizer, ["<answer>2</answer>"])
    manager = RolloutManager(engine, tiny_tokenizer, registry, AgentLoopConfig(), RolloutConfig(n=2),
                             RewardConfig(on_error=mode))
    task = Task(prompt=[{"role": "user", "content": "q"}], reward={"type": "tests_reward_fns:raising_reward"})
    episodes = await manager.generate([task])
    assert all(not e.infra_error and e.reward == 0.0 for e in episodes)  # a policy-side outcome, not infra
    assert episodes[0].metrics["reward_error"] == "RuntimeError: grader crashed (tests_reward_fns.py:18)"
    m = rollout_metrics(episodes)
    assert m["rollout/infra_error_rate"] == 0.0 and m["rollout/reward_errors"] == 2.0


async def test_infra_failed_episodes_are_not_scored(tiny_tokenizer, registry):
    from agentrl.inference.base import EngineError

    engine = ScriptedEngine(tiny_tokenizer, [EngineError("down")])
    manager = RolloutManager(engine, tiny_tokenizer, registry, AgentLoopConfig(), RolloutConfig(n=1), RewardConfig())
    (episode,) = await manager.generate([Task(prompt=[{"role": "user", "content": "q"}],
                                              reward={"type": "tests_reward_fns:raising_reward"})])
    assert episode.infra_error and "reward_error" not in episode.metrics


async def test_bad_reward_spec_or_tool_name_fails_before_any_episode(tiny_tokenizer, registry):
    engine = ScriptedEngine(tiny_tokenizer, ["x"])
    manager = RolloutManager(engine, tiny_tokenizer, registry, AgentLoopConfig(), RolloutConfig(n=1), RewardConfig())
    with pytest.raises(RewardSpecError):
        await manager.generate([Task(prompt=[{"role": "user", "content": "q"}], reward={"type": "nope"})])
    with pytest.raises(UnknownToolError, match="does not serve"):
        await manager.generate([Task(prompt=[{"role": "user", "content": "q"}], tools=["web_search"],
                                     reward={"type": "exact_match", "ground_truth": "x"})])
    assert engine.calls == []
