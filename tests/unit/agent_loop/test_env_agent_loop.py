"""EnvAgentLoop: episodes against environments keep the tool agent's token bookkeeping (mask 0 on everything the
environment writes, logprobs and weight versions aligned), record per-turn rewards, and treat whatever an
environment raises as an infrastructure fault."""

from __future__ import annotations

import pytest
import tests_envs
from scripted_engine import ScriptedEngine

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
from agentrl.config import ConfigError
from agentrl.envs.base import UnknownEnvError
from agentrl.envs.loop import EnvAgentLoop
from agentrl.types import Generation, Task

SCRIPTED = {"scripted": "tests_envs:ScriptedEnv"}


def env_task(name: str = "guess_number", **kwargs) -> Task:
    return Task(prompt=[], reward={"type": "env"}, env={"name": name, "kwargs": kwargs}, task_id="g")


def check_tokens(episode, engine, tokenizer) -> None:
    """Mask 1 exactly on the sampled ids, with their logprobs; the ids render the transcript."""
    sampled = [c.output for c in engine.calls]
    policy_ids = [t for t, m in zip(episode.response_ids, episode.response_mask) if m]
    assert policy_ids == [t for g in sampled for t in g.token_ids]
    assert [lp for lp, m in zip(episode.response_logprobs, episode.response_mask) if m] == \
        [lp for g in sampled for lp in g.logprobs]
    assert all(lp == 0.0 and v == -1 for lp, m, v in zip(episode.response_logprobs, episode.response_mask,
                                                         episode.turn_ids) if not m)
    rendered = tokenizer.apply_chat_template(episode.messages, tokenize=False)
    assert tokenizer.decode(episode.prompt_ids + episode.response_ids, skip_special_tokens=False) + "\n" == rendered
    episode.check()


async def test_guess_number_episode_is_token_exact_with_per_turn_rewards(tokenizer):
    engine = ScriptedEngine(tokenizer, ["<answer>4</answer>", "I say 1", "<answer>6</answer>", "5"])
    loop = EnvAgentLoop(engine, tokenizer, AgentLoopConfig())
    episode = await loop.run(env_task(secret=5, low=1, high=8, max_guesses=6))
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("stop", "env_done")
    # 4 is open (0), 1 was ruled out by "Higher" (-0.1), 6 is open (0), 5 is right (1)
    assert episode.turn_rewards == [0.0, -0.1, 0.0, 1.0] and episode.num_turns == 4
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == \
        ["Higher: from 5 to 8. 5 left.", "Higher: from 5 to 8. 4 left.", "Lower: from 5 to 5. 3 left."]
    assert not episode.infra_error and episode.replay["env"]["name"] == "guess_number"
    assert episode.turns[-1]["env"] == {"reward": 1.0, "done": True, "info": {"guess": 5, "possible": [5, 5],
                                                                              "solved": True}}
    check_tokens(episode, engine, tokenizer)


async def test_weight_versions_cover_policy_tokens_only(tiny_tokenizer):
    def versioned(text, version):
        ids = tiny_tokenizer.encode(text, add_special_tokens=False) + [tiny_tokenizer.convert_tokens_to_ids(
            "<|im_end|>")]
        return Generation(ids, [-0.5] * len(ids), "stop", metrics={"weight_version": version})

    engine = ScriptedEngine(tiny_tokenizer, [versioned("3", 7), versioned("5", 8)])
    episode = await EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig()).run(env_task(secret=5))
    sampled = [t for t, m in zip(episode.response_versions, episode.response_mask) if m]
    assert set(sampled) == {7, 8} and sampled[0] == 7 and sampled[-1] == 8
    assert {v for v, m in zip(episode.response_versions, episode.response_mask) if not m} == {-1}


@pytest.mark.parametrize("fail, where", [("constructor", "constructor raised RuntimeError"),
                                         ("reset", "reset raised ConnectionError"),
                                         ("step", "step raised KeyError"),
                                         ("bad_step", "step returned dict, not a StepResult"),
                                         ("bad_reset", "reset returned 'Start.' instead of a non-empty list"),
                                         ("no_reward", "step returned reward None (must be a finite number)"),
                                         ("assistant_observation", "step: message 0 has role 'assistant'")])
async def test_an_environment_that_raises_is_an_infra_fault(tiny_tokenizer, fail, where):
    engine = ScriptedEngine(tiny_tokenizer, ["move"])
    loop = EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig(envs=SCRIPTED))
    tests_envs.CLOSED.clear()
    episode = await loop.run(env_task("scripted", fail=fail, tag=fail))
    assert episode.infra_error and (episode.finish_reason, episode.metrics["stop_detail"]) == \
        ("infra_error", "env_error")
    assert where in episode.metrics["infra_detail"] and episode.turn_rewards == []
    assert tests_envs.CLOSED == ([] if fail == "constructor" else [fail])  # close() runs whenever there is an env


async def test_max_turns_steps_the_last_turn_but_appends_no_observation(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["a", "b"])
    loop = EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig(envs=SCRIPTED, max_assistant_turns=2))
    episode = await loop.run(env_task("scripted", rewards=[0.25, 0.5, 1.0]))
    assert episode.finish_reason == "max_turns" and episode.turn_rewards == [0.25, 0.5]
    assert episode.messages[-1] == {"role": "assistant", "content": "b"}
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "user", "assistant"]
    check_tokens(episode, engine, tiny_tokenizer)


async def test_a_turn_cut_by_its_length_is_not_stepped(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["ok", "a much longer turn than four tokens allow"])
    loop = EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig(envs=SCRIPTED, max_new_tokens_per_turn=4))
    episode = await loop.run(env_task("scripted", rewards=[0.5, 1.0]))
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("length", "turn_length")
    assert episode.turn_rewards == [0.5] and episode.num_turns == 2


async def test_observations_as_tool_messages(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["a", "b"])
    loop = EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig(envs=SCRIPTED))
    episode = await loop.run(env_task("scripted", rewards=[0.0, 1.0], role="tool"))
    assert episode.messages[3] == {"role": "tool", "content": "obs 0"} and episode.turn_rewards == [0.0, 1.0]
    check_tokens(episode, engine, tiny_tokenizer)


async def test_a_slow_environment_times_out_in_the_env_phase(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["a"])
    loop = EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig(envs=SCRIPTED, episode_timeout_s=0.2))
    episode = await loop.run(env_task("scripted", fail="slow_step"))
    assert episode.finish_reason == "timeout" and episode.metrics["timeout_phase"] == "env" and episode.infra_error


async def test_rollout_runs_env_tasks_beside_tool_tasks_and_sums_turn_rewards(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["4", "6", "5"])
    manager = RolloutManager(engine, tiny_tokenizer, None, AgentLoopConfig(), RolloutConfig(n=2), RewardConfig())
    episodes = await manager.generate([env_task(secret=5, low=1, high=8)])
    assert [e.turn_rewards for e in episodes] == [[0.0, 0.0, 1.0]] * 2
    assert [e.reward for e in episodes] == [1.0, 1.0]


async def test_unknown_env_names_and_bad_kwargs_fail_before_any_episode(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [])
    manager = RolloutManager(engine, tiny_tokenizer, None, AgentLoopConfig(), RolloutConfig(n=1), RewardConfig())
    with pytest.raises(UnknownEnvError, match="environment 'chess' is not registered .* agent.envs.chess"):
        await manager.generate([env_task("chess")])
    with pytest.raises(UnknownEnvError, match="does not accept kwargs"):
        await manager.generate([env_task(secret=3, colour="red")])
    assert engine.calls == []


def test_agent_envs_are_checked_at_config_load():
    with pytest.raises(ConfigError, match="needs an async method reset"):
        AgentLoopConfig(envs={"x": "tests_envs:NotAnEnv"})
    with pytest.raises(ConfigError, match="shadows the built-in environment 'guess_number'"):
        AgentLoopConfig(envs={"guess_number": "tests_envs:ScriptedEnv"})
    with pytest.raises(ConfigError, match="cannot import module"):
        AgentLoopConfig(envs={"x": "no_such_module:Env"})


async def test_guess_games_on_the_tiny_model_through_the_local_engine(guessing_model_dir):
    from agentrl.data.suites import make_suite
    from agentrl.data.tasks import task_from_row
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(guessing_model_dir, EngineConfig(max_model_len=1024))
    tokenizer = engine.tokenizer
    tasks = [task_from_row(r) for r in make_suite("guess", "train", 4, seed=0)[0]]
    config = AgentLoopConfig(max_new_tokens_per_turn=8, max_response_tokens=300, max_assistant_turns=5)
    try:
        manager = RolloutManager(engine, tokenizer, None, config, RolloutConfig(n=4, seed=1), RewardConfig())
        episodes = await manager.generate(tasks)
    finally:
        await engine.close()
    assert not any(e.infra_error for e in episodes)
    done = [e for e in episodes if e.metrics["stop_detail"] == "env_done"]
    assert done and {e.finish_reason for e in episodes} <= {"stop", "length", "max_turns"}
    for e in episodes:
        e.check()
        assert e.reward == pytest.approx(sum(e.turn_rewards))
        stepped = e.num_turns - (e.metrics["stop_detail"] == "turn_length")
        assert len(e.turn_rewards) == stepped and all(r in (-0.1, 0.0, 1.0) for r in e.turn_rewards)
        assert all(lp < 0 for lp, m in zip(e.response_logprobs, e.response_mask) if m)
        assert all(lp == 0.0 and t == -1 for lp, m, t in zip(e.response_logprobs, e.response_mask, e.turn_ids)
                   if not m)
    for e in done:  # a finished game's ids are its transcript's rendering, observations and all
        rendered = tokenizer.apply_chat_template(e.messages, tokenize=False)
        assert tokenizer.decode(e.prompt_ids + e.response_ids, skip_special_tokens=False) + "\n" == rendered
        assert e.messages[-1]["role"] == "assistant"


def test_replay_names_environment_episodes_as_out_of_its_reach():
    from agentrl.agent_loop.replay import ReplayError, replay_inputs

    row = {"episode_id": "e1", "turns": [{}], "replay": {"env": {"name": "guess_number", "kwargs": {}}}}
    with pytest.raises(ReplayError, match="played against environment 'guess_number'; agentrl replay re-runs tool"):
        replay_inputs(row)
