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
        self.release: dict[str, asyncio.Event] = {}

    async def generate_group(self, task: Task, *, uid: str, slots: asyncio.Semaphore) -> list[Episode]:
        self.started.append(uid)
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
