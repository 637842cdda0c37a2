"""The async trainer's producer and its buffer of finished groups (`trainer.mode: async`).

    producer:  while True:
                   wait for a free episode slot and for the staleness budget
                   task = sampler.next(); run rollout.n episodes of it as one group (a task of its own)
                   finished group -> buffer
    trainer:   groups = buffer.take(groups_per_step)   (as soon as that many are finished; then refills)

`groups_per_step` is what sync mode's first round draws: data.gen_batch_size, else data.train_batch_size. The
staleness budget is AReaL's: at most `(trainer_version + max_staleness + 1) * groups_per_step` groups are ever
submitted (plus the refills and replacements the trainer asks for), so a group is submitted at most
`max_staleness` versions before the update that trains on it. With max_staleness 0 the producer submits step s's
groups only once the weights of step s - 1 are in the engine, so async trains exactly the batches sync trains.

Group g (counted from 0 over the whole run) is named `step{s}-0-task{i}` with s = g // groups_per_step + 1 and
i = g % groups_per_step, the uid sync mode gives the same task: sampling seeds derive from it, so the same group
samples the same tokens in both modes.

Replacement groups take the next indices, so after a drop a step's groups carry the names of later ones. A
checkpoint records (`checkpoint_state`) the index of the oldest group not trained and the replacements granted,
and a resumed buffer (`resume_from`) submits from that index again: the regenerated groups get the names and
sampler draws of the groups they replace, as in the run that was stopped.

The budget counts the trainer's finished steps (`step_done`). Idle time is
measured on both sides: the trainer waiting in `take` (`async/trainer_wait_s`), and the engine with no episode in
flight because the budget is spent (`async/engine_wait_s`, the rollout side waiting for new weights).
"""

from __future__ import annotations

import asyncio
import time

from agentrl.types import Episode, Task


class GroupBuffer:
    """Runs `rollout.generate_group` for task after task under the staleness budget; finished groups wait in
    submission order for `take`. Start with `start()`, stop with `close()` (cancels the groups in flight)."""

    def __init__(self, rollout, sampler, *, groups_per_step: int, max_staleness: int, max_episodes: int,
                 group_size: int, trained_steps: int, total_steps: int, resume_from: dict | None = None):
        self.rollout, self.sampler = rollout, sampler
        self.groups_per_step, self.max_staleness = groups_per_step, max_staleness
        self.trained_steps, self.total_steps = trained_steps, total_steps
        self.submitted = trained_steps * groups_per_step  # groups before this run's first step were trained earlier
        self.extra = 0  # replacements for groups the trainer dropped
        if resume_from is not None:  # a checkpoint's `checkpoint_state`: the first group not trained, drops counted
            self.submitted, self.extra = resume_from["next_group"], resume_from["extra"]
        self.slots = asyncio.Semaphore(max_episodes)
        self.max_groups_in_flight = max(1, max_episodes // group_size)
        self.in_flight: set[asyncio.Task] = set()
        self.ready: dict[int, list[Episode]] = {}  # group index -> episodes
        self.sampler_at: dict[int, dict] = {}  # group index not yet taken -> sampler state before its draw
        self.untrained: dict[int, dict] = {}  # the same for the groups taken by the step in progress
        self.changed = asyncio.Event()
        self.trainer_wait_s = self.engine_wait_s = 0.0
        self._producer: asyncio.Task | None = None
        self._failure: BaseException | None = None

    def budget(self) -> int:
        steps = min(self.trained_steps + self.max_staleness + 1, self.total_steps)  # nothing past the last step
        return steps * self.groups_per_step + self.extra

    def start(self) -> None:
        self._producer = asyncio.create_task(self._produce())

    async def close(self) -> None:
        tasks = [*self.in_flight] + ([self._producer] if self._producer is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def step_done(self, step: int) -> None:
        """The trainer finished step `step` (its weights are in the engine, or it had nothing to train on): the
        budget grows by a step, and the groups it took count as trained."""
        self.trained_steps = step
        self.untrained.clear()
        self.changed.set()

    def replace(self, count: int) -> None:
        """Submit `count` more groups: a refill round's, or in place of stale ones the trainer dropped."""
        self.extra += count
        self.changed.set()

    async def take(self, count: int) -> list[tuple[int, list[Episode]]]:
        """`count` finished groups as (group index, episodes), the first ones to finish, in submission order."""
        t0 = time.perf_counter()
        while len(self.ready) < count:
            self._raise_failure()
            self.changed.clear()
            await self.changed.wait()
        self.trainer_wait_s += time.perf_counter() - t0
        chosen = sorted(list(self.ready)[:count])  # the dict holds groups in the order they finished
        self.untrained.update({index: self.sampler_at.pop(index) for index in chosen})
        return [(index, self.ready.pop(index)) for index in chosen]

    def sampler_state(self) -> dict:
        """The sampler's position for a checkpoint: where the oldest group not yet taken was drawn, so a resume
        draws it again (groups in flight or buffered are regenerated, not saved). Groups drawn after it and
        already trained are drawn again too: at most (max_staleness + 1) * groups_per_step of them."""
        pending = self._pending()
        return pending[min(pending)] if pending else self.sampler.state_dict()

    def checkpoint_state(self) -> dict:
        """What a resumed buffer needs besides the sampler's position (`resume_from`): the index of the group
        drawn at that position, and the replacements granted so far (the budget counts them)."""
        pending = self._pending()
        return {"next_group": min(pending) if pending else self.submitted, "extra": self.extra}

    def _pending(self) -> dict[int, dict]:
        """Group index -> sampler state before its draw, for every group submitted and not yet trained."""
        return {**self.sampler_at, **self.untrained}

    def metrics(self) -> dict[str, float]:
        """Buffer and idle figures since the last call (the idle seconds reset)."""
        out = {"async/buffer_groups": float(len(self.ready)), "async/groups_in_flight": float(len(self.in_flight)),
               "async/trainer_wait_s": self.trainer_wait_s, "async/engine_wait_s": self.engine_wait_s}
        self.trainer_wait_s = self.engine_wait_s = 0.0
        return out

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _produce(self) -> None:
        try:
            await self._submit_forever()
        except Exception as e:  # a bug here must not leave the trainer waiting forever
            self._failure = e
            self.changed.set()

    async def _submit_forever(self) -> None:
        while True:
            idle_since = None
            while self.submitted >= self.budget() or len(self.in_flight) >= self.max_groups_in_flight:
                if not self.in_flight and idle_since is None and self.submitted >= self.budget():
                    idle_since = time.perf_counter()
                self.changed.clear()
                await self.changed.wait()
            if idle_since is not None:
                self.engine_wait_s += time.perf_counter() - idle_since
            index = self.submitted
            self.sampler_at[index] = self.sampler.state_dict()
            task = self.sampler.next(1)[0]
            self.submitted += 1
            running = asyncio.create_task(self._group(index, task))
            self.in_flight.add(running)

    async def _group(self, index: int, task: Task) -> None:
        step, position = divmod(index, self.groups_per_step)
        try:
            self.ready[index] = await self.rollout.generate_group(task, uid=f"step{step + 1}-0-task{position}",
                                                                  slots=self.slots)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a reward function raised, or a bug: the trainer's next `take` raises it
            self._failure = e
        finally:
            self.in_flight.discard(asyncio.current_task())
            self.changed.set()


__all__ = ["GroupBuffer"]
