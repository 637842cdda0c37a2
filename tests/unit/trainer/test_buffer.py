"""The async producer: it never submits past the staleness budget, hands groups over in submission order, names
them as sync mode does, and a checkpoint saves the sampler position of the oldest group not trained yet."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.trainer.buffer import GroupBuffer
from agentrl.trainer.loop import TaskSampler
from agentrl.types import Episode, Task


class GatedRollout:
    """Stands in for RolloutManager: a group finishes when the test releases its uid."""

    def __init__(self):
        self.started: list[str] = []
        self.drawn: list[str] = []  # the task of each started group
        self.release: dict[str, asyncio.Event] = {}

    async def generate_group(self, task: Task, *, uid: str, slots: asyncio.Semaphore) -> list[Episode]:
        self.started.append(uid)
        self.drawn.append(task.task_id)
        self.release[uid] = asyncio.Event()
        await self.release[uid].wait()
        return [Episode(uid=uid, prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1.0],
                        response_versions=[0], messages=[], task_id=task.task_id)]


def tasks(n: int) -> list[Task]:
    return [Task(prompt=[{"role": "user", "content": str(i)}], task_id=f"t{i}") for i in range(n)]


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("max_staleness", [0, 1])
async def test_submissions_stay_within_the_staleness_budget(max_staleness):
    rollout = GatedRollout()
    sampler = TaskSampler(tasks(10), 2, shuffle=False, seed=0)
    buffer = GroupBuffer(rollout, sampler, groups_per_step=2, max_staleness=max_staleness, max_episodes=64,
                         group_size=1, trained_steps=0, total_steps=3)
    buffer.start()
    try:
        await settle()
        ahead = ["step2-0-task0", "step2-0-task1"] if max_staleness else []
        assert rollout.started == ["step1-0-task0", "step1-0-task1", *ahead]  # sync mode's uids
        rollout.release["step1-0-task1"].set()
        rollout.release["step1-0-task0"].set()
        taken = await buffer.take(2)
        assert [index for index, _ in taken] == [0, 1]  # submission order, whatever order they finished in
        assert [group[0].task_id for _, group in taken] == ["t0", "t1"]
        await settle()
        assert len(rollout.started) == 2 + len(ahead)  # taking is not training: the budget waits for the step
        assert buffer.sampler_state() == {"epoch": 0, "index": 0}  # step 1 not trained yet: redraw from t0
        buffer.step_done(1)
        await settle()
        assert len(rollout.started) == 4 + (2 if max_staleness else 0)
        assert buffer.sampler_state() == {"epoch": 0, "index": 2}
        buffer.step_done(2)
        await settle()
        assert len(rollout.started) == 6  # never past the last step's groups
    finally:
        await buffer.close()


async def test_a_failed_group_reaches_the_trainer():
    class Failing(GatedRollout):
        async def generate_group(self, task, *, uid, slots):
            raise RuntimeError(f"reward function raised in {uid}")

    buffer = GroupBuffer(Failing(), TaskSampler(tasks(4), 2, shuffle=False, seed=0), groups_per_step=2,
                         max_staleness=0, max_episodes=8, group_size=1, trained_steps=0, total_steps=1)
    buffer.start()
    try:
        with pytest.raises(RuntimeError, match="reward function raised in step1-0-task"):
            await buffer.take(2)
    finally:
        await buffer.close()


async def test_a_resume_after_a_drop_regenerates_the_groups_under_their_names():
    def new_buffer(rollout, sampler, resume_from=None):
        return GroupBuffer(rollout, sampler, groups_per_step=2, max_staleness=1, max_episodes=64, group_size=1,
                           trained_steps=1 if resume_from else 0, total_steps=3, resume_from=resume_from)

    rollout, sampler = GatedRollout(), TaskSampler(tasks(10), 2, shuffle=False, seed=0)
    buffer = new_buffer(rollout, sampler)
    buffer.start()
    try:
        await settle()
        for uid in ("step1-0-task0", "step1-0-task1", "step2-0-task0"):
            rollout.release[uid].set()
        await buffer.take(2)
        buffer.replace(1)  # the trainer dropped one of them: group 2 takes its place in step 1
        assert [index for index, _ in await buffer.take(1)] == [2]
        buffer.step_done(1)
        await settle()
        state, position = buffer.checkpoint_state(), buffer.sampler_state()
        assert state == {"next_group": 3, "extra": 1} and position == {"epoch": 0, "index": 3}
        stopped_run = list(zip(rollout.started, rollout.drawn))[3:]
    finally:
        await buffer.close()

    resumed, sampler = GatedRollout(), TaskSampler(tasks(10), 2, shuffle=False, seed=0)
    sampler.load_state_dict(position)
    buffer = new_buffer(resumed, sampler, resume_from=state)
    buffer.start()
    try:
        await settle()
        assert list(zip(resumed.started, resumed.drawn)) == stopped_run
        assert stopped_run[0] == ("step2-0-task1", "t3")  # group 3: a name and a task as before the stop
        assert buffer.budget() == 2 * 3 + 1  # the budget counts the replacement granted before the stop
    finally:
        await buffer.close()


class RewardedRollout:
    """Finishes each group at once; a task's group has reward variance when `signal(task index)`."""

    def __init__(self, signal):
        self.signal, self.started = signal, []

    async def generate_group(self, task: Task, *, uid: str, slots: asyncio.Semaphore) -> list[Episode]:
        self.started.append(task.task_id)
        rewards = (0.0, 1.0) if self.signal(int(task.task_id[1:])) else (1.0, 1.0)
        return [Episode(uid=uid, prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1.0],
                        response_versions=[0], messages=[], task_id=task.task_id, reward=r) for r in rewards]


@pytest.mark.parametrize("signal, rounds, taken", [
    (lambda i: i % 2 == 0, 1, ["t0", "t1", "t2", "t3"]),  # the first round (gen_batch_size groups) is enough
    (lambda i: i % 4 == 0, 2, ["t0", "t1", "t2", "t3", "t4", "t5"]),  # one refill, oversampled as sync's: 1 -> 2
])
async def test_async_rounds_take_what_sync_rounds_draw(signal, rounds, taken, tmp_path):
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig
    from agentrl.trainer.loop import collect_from_buffer

    cfg = load_config(TrainConfig, data={"model": {"path": "m"}, "data": {
        "train_files": ["t.jsonl"], "train_batch_size": 2, "gen_batch_size": 4}}, overrides=[
        "rollout.n=2", "actor.ppo_mini_batch_size=2", "algorithm.filter_zero_variance_groups=true",
        "algorithm.max_filter_rounds=2",
        "trainer.mode=async", "trainer.max_staleness=1", "algorithm.rollout_correction.level=token",
        "rollout.dump_episodes=false", f"trainer.run_dir={tmp_path}"])
    rollout = RewardedRollout(signal)
    buffer = GroupBuffer(rollout, TaskSampler(tasks(20), 2, shuffle=False, seed=0), groups_per_step=4,
                         max_staleness=1, max_episodes=64, group_size=2, trained_steps=0, total_steps=5)
    buffer.start()
    try:
        episodes, stats, generated = await collect_from_buffer(buffer, cfg, step=1, trainer_version=0)
    finally:
        await buffer.close()
    assert sorted({ep.task_id for ep in generated}, key=lambda t: int(t[1:])) == taken
    assert stats["data/groups"] == 2 and stats["data/rollout_rounds"] == rounds
    assert {ep.task_id for ep in episodes} == {t for t in taken if signal(int(t[1:]))}
    assert stats["data/zero_var_groups"] == len(taken) - sum(signal(int(t[1:])) for t in taken)
