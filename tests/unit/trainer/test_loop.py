"""The loop's data handling: infra failures never reach training, zero-variance groups are refilled, and the
task sampler resumes where it stopped."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.errors import InfraFailureError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.loop import TaskSampler, collect_episodes
from agentrl.trainer.stops import InfraLimits, InfraWatch
from agentrl.types import Episode, Task


class ScriptedRollout:
    """Stands in for RolloutManager: rewards and infra flags come from each task's `extra`."""

    def __init__(self, n: int):
        self.n = n
        self.calls = 0

    async def generate(self, tasks: list[Task], *, step: int = 0, n: int | None = None) -> list[Episode]:
        self.calls += 1
        out = []
        for i, task in enumerate(tasks):
            for k in range(self.n):
                out.append(Episode(uid=f"step{step}-task{i}", prompt_ids=[1, 2], response_ids=[3], response_mask=[1],
                                   response_logprobs=[-1.0], messages=[], reward=task.extra["rewards"][k],
                                   infra_error=k in task.extra.get("infra", []), task_id=task.task_id))
                if k in task.extra.get("reward_errors", []):  # reward.on_error zero / drop kept the episode
                    out[-1].metrics["reward_error"] = "KeyError: 'answer' (my_rewards.py:3)"
        return out


def task(name: str, rewards: list[float], infra: list[int] | None = None,
         reward_errors: list[int] | None = None) -> Task:
    return Task(prompt=[{"role": "user", "content": name}], task_id=name,
                extra={"rewards": rewards, "infra": infra or [], "reward_errors": reward_errors or []})


def cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["data.train_batch_size=2", "rollout.n=3", "actor.ppo_mini_batch_size=1",
                                           *overrides])


async def test_infra_failed_episodes_are_dropped_and_counted():
    tasks = [task("a", [1, 0, 1], infra=[1]), task("b", [0, 1, 0], infra=[0, 1, 2])]
    sampler = TaskSampler(tasks, 2, shuffle=False, seed=0)
    episodes, stats, generated = await collect_episodes(ScriptedRollout(3), sampler, cfg(), step=1)
    assert len(generated) == 6
    assert not any(ep.infra_error for ep in episodes)
    assert [ep.task_id for ep in episodes] == ["a", "a"]
    assert stats["data/infra_failed"] == 4
    assert stats["data/zero_var_groups"] == 1  # "a" keeps two episodes, both reward 1
    assert stats["data/signal_groups"] == 0  # so the step has nothing to learn from


async def test_a_step_with_too_many_infra_failures_stops_the_run():
    tasks = [task("a", [1, 0, 1], infra=[1]), task("b", [0, 1, 0], infra=[0, 1, 2])]
    _, _, generated = await collect_episodes(ScriptedRollout(3), TaskSampler(tasks, 2, shuffle=False, seed=0), cfg(),
                                             step=1)
    InfraWatch(InfraLimits(1.0, 1.0, 0), services={}).check(1, generated)  # never stops (4 of 6 failed)
    InfraWatch(InfraLimits(0.7, 1.0, 0), services={}).check(1, generated)
    with pytest.raises(InfraFailureError, match="step 1: 4 of 6 episodes failed for an infrastructure reason, "
                                                "more than trainer.max_infra_failed_fraction=0.5"):
        InfraWatch(InfraLimits(0.5, 1.0, 0), services={}).check(1, generated)
    t = cfg().trainer
    assert (t.max_infra_failed_fraction, t.infra_streak_fraction, t.infra_streak_steps) == (0.5, 0.25, 3)
    with pytest.raises(ValueError, match="max_infra_failed_fraction"):
        cfg("trainer.max_infra_failed_fraction=1.5")
    with pytest.raises(ValueError, match="infra_streak_steps must be >= 0"):
        cfg("trainer.infra_streak_steps=-1")


async def test_reward_on_error_drop_leaves_the_whole_group_out_and_zero_trains_it():
    tasks = [task("a", [1, 0, 0], reward_errors=[1]), task("b", [0, 1, 0])]
    episodes, stats, _ = await collect_episodes(ScriptedRollout(3), TaskSampler(tasks, 2, shuffle=False, seed=0),
                                                cfg("reward.on_error=drop"), step=1)
    assert [ep.task_id for ep in episodes] == ["b"] * 3
    assert stats["data/reward_error_groups"] == 1 and stats["data/groups"] == 1
    episodes, stats, _ = await collect_episodes(ScriptedRollout(3), TaskSampler(tasks, 2, shuffle=False, seed=0),
                                                cfg("reward.on_error=zero"), step=1)
    assert [ep.task_id for ep in episodes] == ["a"] * 3 + ["b"] * 3 and "data/reward_error_groups" not in stats


async def test_zero_variance_groups_are_refilled_from_new_tasks():
    tasks = [task("flat", [1, 1, 1]), task("good1", [0, 1, 0]), task("flat0", [0, 0, 0]), task("good2", [1, 0, 0]),
             task("good3", [1, 0, 1])]
    rollout = ScriptedRollout(3)
    sampler = TaskSampler(tasks, 2, shuffle=False, seed=0)
    episodes, stats, _ = await collect_episodes(rollout, sampler, cfg("algorithm.filter_zero_variance_groups=true"),
                                                step=4)
    assert sorted({ep.task_id for ep in episodes}) == ["good1", "good2"]
    assert stats["data/zero_var_groups"] == 2 and stats["data/rollout_rounds"] == 3
    assert stats["data/signal_groups"] == stats["data/groups"] == 2
    assert len({ep.uid for ep in episodes}) == 2  # refill rounds get distinct group ids
    assert sampler.state_dict() == {"epoch": 0, "index": 4}


async def test_filter_gives_up_after_max_rounds():
    tasks = [task("flat", [1, 1, 1])]
    rollout = ScriptedRollout(3)
    episodes, _stats, _ = await collect_episodes(rollout, TaskSampler(tasks, 2, shuffle=False, seed=0),
                                                cfg("algorithm.filter_zero_variance_groups=true",
                                                    "algorithm.max_filter_rounds=2"), step=1)
    assert episodes == [] and rollout.calls == 3


async def test_gen_batch_size_oversamples_each_round_in_proportion():
    tasks = [task("flat", [1, 1, 1]), task("good1", [0, 1, 0]), task("flat0", [0, 0, 0]), task("flat1", [1, 1, 1]),
             task("good2", [1, 0, 0]), task("flat2", [0, 0, 0]), task("good3", [1, 0, 1])]
    rollout = ScriptedRollout(3)
    sampler = TaskSampler(tasks, 2, shuffle=False, seed=0)
    episodes, stats, generated = await collect_episodes(
        rollout, sampler, cfg("algorithm.filter_zero_variance_groups=true", "data.gen_batch_size=4"), step=1)
    # round 1: 4 prompts (one group with signal), round 2: 1 missing group x 4/2 = 2 prompts (good2 fills it)
    assert [ep.task_id for ep in episodes] == ["good1"] * 3 + ["good2"] * 3
    assert stats["data/rollout_rounds"] == 2 and len(generated) == 6 * 3 and rollout.calls == 2
    assert sampler.state_dict() == {"epoch": 0, "index": 6}
    # more groups with signal than the step trains on: the first train_batch_size are kept
    sampler = TaskSampler([task("a", [0, 1, 0]), task("b", [1, 0, 0]), task("c", [0, 0, 1])], 2, shuffle=False, seed=0)
    episodes, stats, _ = await collect_episodes(
        ScriptedRollout(3), sampler, cfg("algorithm.filter_zero_variance_groups=true", "data.gen_batch_size=3"), step=1)
    assert [ep.task_id for ep in episodes] == ["a"] * 3 + ["b"] * 3 and stats["data/groups"] == 2


def test_gen_batch_size_is_checked_at_load():
    with pytest.raises(ValueError, match="must be >= data.train_batch_size"):
        cfg("data.gen_batch_size=1", "algorithm.filter_zero_variance_groups=true")
    with pytest.raises(ValueError, match="only serves dynamic sampling"):
        cfg("data.gen_batch_size=4")
    assert cfg("data.gen_batch_size=2").data.gen_batch_size == 2  # equal to the batch: harmless without filtering


def test_sampler_state_round_trip_continues_the_same_sequence():
    tasks = [task(str(i), [0, 0, 0]) for i in range(5)]
    a = TaskSampler(tasks, 2, shuffle=True, seed=3)
    a.next(), a.next(), a.next()
    state = a.state_dict()
    b = TaskSampler(tasks, 2, shuffle=True, seed=3)
    b.load_state_dict(state)
    assert [t.task_id for t in a.next(7)] == [t.task_id for t in b.next(7)]
    assert state["epoch"] == 1


def test_mini_batch_must_divide_the_train_batch():
    with pytest.raises(ValueError, match="multiple of"):
        cfg("actor.ppo_mini_batch_size=3")
