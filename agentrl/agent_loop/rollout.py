"""`RolloutManager`: n episodes per task (one group uid), bounded concurrency, rewards, episodes.jsonl.

All episodes of a call share one pool of `rollout.max_concurrent_episodes` slots (a semaphore), whatever the
number of engines behind the `Engine` (an SGLang client spreads requests over its servers). Each episode runs
its turns and then its reward inside its slot. The per-episode wall-clock limit is `agent.episode_timeout_s`
(`ToolAgentLoop` ends the episode with finish_reason "timeout" and keeps what it had).

Tasks with an `env` run in `agentrl.envs.loop.EnvAgentLoop`, the others in `ToolAgentLoop`; both share the
budgets, timeouts and token bookkeeping of `agentrl.agent_loop.turns`.

Rewards: infra-failed episodes (engine, tool or environment fault, timeout) are not scored (reward 0.0,
`infra_error` True); the others are scored by `rewards.score_episode`: a sandbox fault marks the episode
infra_error, and a reward function that raises stops `generate` with a `RewardError` (the other episodes are
cancelled) unless `reward.on_error` is "zero" or "drop". An environment's per-turn rewards
(`Episode.turn_rewards`) are added to the score: `Episode.reward` is the whole return.
"""

from __future__ import annotations

import asyncio
import json
import sys
import zlib
from collections import Counter
from pathlib import Path

from agentrl.agent_loop.agent_program import AgentProgramLoop
from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig, load_agent_program
from agentrl.agent_loop.rewards import RewardError, check_reward_specs, reward_failed, score_episode
from agentrl.agent_loop.tool_agent import ToolAgentLoop
from agentrl.auth import ServiceAuthError
from agentrl.envs.base import check_task_env
from agentrl.envs.loop import EnvAgentLoop
from agentrl.tools.errors import UnknownToolError
from agentrl.types import FINISH_REASONS_EPISODE, Episode, SamplingParams, Task

EPISODES_FILE = "episodes.jsonl"
TRAIN_RECORDS_FILE = "train_records.jsonl"  # per trained episode: advantage, trainer logprobs


class RolloutManager:
    def __init__(self, engine, tokenizer, tools, agent_config: AgentLoopConfig, rollout_config: RolloutConfig,
                 reward_config: RewardConfig, run_dir: str | Path | None = None):
        self.agent = ToolAgentLoop(engine, tokenizer, tools, agent_config)
        self.env_agent = EnvAgentLoop(engine, tokenizer, agent_config)
        self.program = None  # rollout.agent_program: episodes run by an agent program through the policy front
        if rollout_config.agent_program is not None:
            self.program = AgentProgramLoop(engine, tokenizer, load_agent_program(rollout_config.agent_program),
                                            agent_config)
        self.tools = tools
        self.rollout_config = rollout_config
        self.reward_config = reward_config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._calls_in_step: dict[int, int] = {}  # generate() calls so far in the current step

    async def aclose(self) -> None:
        """Stop the policy front an agent program used (nothing to do for ToolAgentLoop)."""
        if self.program is not None:
            await self.program.aclose()

    async def generate(self, tasks: list[Task], *, step: int = 0, n: int | None = None,
                       progress=None) -> list[Episode]:
        """Roll out every task `n` times (default `rollout.n`); returns episodes in task order, then sample
        index (an agent program's split episode: its samples in a row), with rewards filled in. Writes them to
        run_dir/episodes.jsonl when a run dir is set.
        `progress`: what counts finished episodes (`update(1)`, `close()`); default a tqdm bar on a terminal.

        Group uids are f"step{step}-{k}-task{i}" with k counting the calls made for this step (refill rounds
        get distinct groups); sampling seeds derive from the uid, so a resumed run repeats them."""
        n = self.rollout_config.n if n is None else n
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_reward_specs(tasks, self.reward_config)
        if self.tools is not None:
            await self.tools.start()  # discovers remote tool schemas (idempotent)
        self._check_tool_names(tasks)
        self._check_envs(tasks)
        call = self._calls_in_step.get(step, 0)
        self._calls_in_step = {step: call + 1}
        slots = asyncio.Semaphore(self.rollout_config.max_concurrent_episodes)
        if progress is None:
            progress = _progress(len(tasks) * n, f"rollout step {step}")

        jobs = [(t, f"step{step}-{call}-task{i}", k) for i, t in enumerate(tasks) for k in range(n)]
        try:
            episodes = await self._run_episodes(jobs, slots, progress)
        finally:
            if progress is not None:
                progress.close()
        if self.run_dir is not None and self.rollout_config.dump_episodes and episodes:
            write_episodes(self.run_dir / EPISODES_FILE, episodes, step=step, n=n)
        return episodes

    async def generate_group(self, task: Task, *, uid: str, slots: asyncio.Semaphore) -> list[Episode]:
        """`rollout.n` episodes of `task` in group `uid` (sampling seeds derive from it), each run in one of
        `slots`: the async trainer's producer shares one pool of `rollout.max_concurrent_episodes` slots among all
        its groups. Rewards filled in; nothing written (the trainer writes the groups it takes)."""
        check_reward_specs([task], self.reward_config)
        if self.tools is not None:
            await self.tools.start()
        self._check_tool_names([task])
        self._check_envs([task])
        return await self._run_episodes([(task, uid, k) for k in range(self.rollout_config.n)], slots, None)

    async def _run_episodes(self, jobs: list[tuple[Task, str, int]], slots: asyncio.Semaphore,
                            progress) -> list[Episode]:
        """One episode per (task, group uid, sample index), each in a slot; results in `jobs` order."""

        async def one(task: Task, uid: str, sample: int) -> list[Episode]:
            async with slots:
                episodes = await self._episode(task, uid=uid, sample=sample)
            if progress is not None:
                progress.update(1)
            return episodes

        try:  # a TaskGroup cancels the other episodes if one fails with a bug (not an infra error)
            async with asyncio.TaskGroup() as group:
                running = [group.create_task(one(*job)) for job in jobs]
        except ExceptionGroup as failed:  # a reward function raised (or a service refused our token): one line
            first = next((e for e in failed.exceptions if isinstance(e, (RewardError, ServiceAuthError))), None)
            if first is None:
                raise
            raise first from first.__cause__
        return [episode for r in running for episode in r.result()]  # an agent program's split samples in a row

    async def _episode(self, task: Task, *, uid: str, sample: int) -> list[Episode]:
        cfg = self.rollout_config
        seed = None if cfg.seed is None else zlib.crc32(f"{cfg.seed}/{uid}/{sample}".encode())
        sampling = SamplingParams(max_new_tokens=1, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                  seed=seed)
        if self.program is not None:
            return await self._program_episode(task, sampling, uid=uid, sample=sample)
        agent = self.agent if task.env is None else self.env_agent
        episode = await agent.run(task, sampling=sampling, uid=uid, session_id=f"{uid}-{sample}")
        episode.metrics["sample_index"] = sample
        if episode.infra_error:
            return [episode]
        await score_episode(task, episode, self.reward_config)
        if episode.turn_rewards and not episode.infra_error:
            episode.reward += sum(episode.turn_rewards)
        return [episode]

    async def _program_episode(self, task: Task, sampling: SamplingParams, *, uid: str,
                               sample: int) -> list[Episode]:
        """An agent program's episode: its samples, scored once (the program's number, or the task's reward spec
        on the final transcript) and all given that score."""
        first, *rest = await self.program.run(task, sampling=sampling, uid=uid, session_id=f"{uid}-{sample}")
        if not first.infra_error and first.metrics["reward_from"] == "transcript":
            await score_episode(task, first, self.reward_config)
        for ep in (first, *rest):
            ep.metrics["sample_index"] = sample
            ep.reward, ep.infra_error = first.reward, first.infra_error
            for key in ("reward_error", "infra_detail"):
                if key in first.metrics:
                    ep.metrics[key] = first.metrics[key]
        return [first, *rest]

    def _check_envs(self, tasks: list[Task]) -> None:
        """Every task's environment is registered and takes its kwargs (UnknownEnvError, one line)."""
        for i, task in enumerate(tasks):
            if task.env is not None:
                check_task_env(task, self.agent.config.envs, f"task {i} ({task.task_id or 'no task_id'})")

    def _check_tool_names(self, tasks: list[Task]) -> None:
        if self.tools is None:
            return
        names = set(self.tools.names())
        for i, task in enumerate(tasks):
            unknown = [t for t in task.tools or [] if t not in names]
            if unknown:
                raise UnknownToolError(f"task {i} ({task.task_id or 'no task_id'}) names tools {unknown} that the tool "
                                 f"registry does not serve (it serves {sorted(names)}); fix the task's 'tools' or "
                                 "the tools config")


def write_episodes(path: Path, episodes: list[Episode], *, step: int, n: int) -> None:
    """Append one JSON line per episode: Episode.to_dict() plus "step" and "sample_index"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, episode in enumerate(episodes):
        row = episode.to_dict()
        row["step"] = step
        row["sample_index"] = episode.metrics.get("sample_index", i % n)
        lines.append(json.dumps(row, ensure_ascii=False))
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_train_records(run_dir: str | Path, step: int, episodes: list[Episode], advantages_B,
                        old_logprobs_B_L) -> None:
    """Append one TRAIN_RECORDS_FILE line per trained episode: {"step", "episode_id", "uid", "advantage",
    "trainer_logprobs"}, the logprobs aligned with `response_ids` (0.0 where the mask is 0).

    `advantages_B` [B] and `old_logprobs_B_L` [B, L] are the trainer's, in `episodes` order (the batch layout of
    `agentrl.trainer.batch`: position p of a row is token p of prompt + response). `agentrl view` shows them next
    to the rollout logprobs; a resume rewinds the file with episodes.jsonl (`agentrl.trainer.resume`).
    """
    lines = []
    for i, ep in enumerate(episodes):
        start = len(ep.prompt_ids)
        trainer = old_logprobs_B_L[i, start:start + len(ep.response_ids)].tolist()
        lines.append(json.dumps({"step": step, "episode_id": ep.episode_id, "uid": ep.uid,
                                 "advantage": float(advantages_B[i]),
                                 "trainer_logprobs": [round(x, 6) if m else 0.0
                                                      for x, m in zip(trainer, ep.response_mask)]}))
    if lines:
        with (Path(run_dir) / TRAIN_RECORDS_FILE).open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def read_episodes(path: str | Path) -> list[dict]:
    """The rows written by `write_episodes` (Episode fields plus step and sample_index)."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def rollout_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Scalar summaries of one rollout: rewards over trainable episodes, stop reasons, tool errors, turns."""
    total = len(episodes)
    if total == 0:
        return {}
    ok = [e for e in episodes if not e.infra_error]
    reasons = Counter(e.finish_reason for e in episodes)
    calls = sum(e.metrics.get("tool_calls", 0) for e in episodes)
    errors = sum(e.metrics.get("tool_errors", 0) for e in episodes)
    out = {
        "rollout/episodes": float(total),
        "rollout/infra_error_rate": 1.0 - len(ok) / total,
        "rollout/reward_mean": sum(e.reward for e in ok) / len(ok) if ok else 0.0,
        "rollout/turns_mean": sum(e.num_turns for e in episodes) / total,
        "rollout/response_tokens_mean": sum(len(e.response_ids) for e in episodes) / total,
        "rollout/policy_tokens_mean": sum(sum(e.response_mask) for e in episodes) / total,
        "rollout/tool_calls_per_episode": calls / total,
        "rollout/tool_error_rate": errors / calls if calls else 0.0,
        "rollout/reward_errors": float(sum(reward_failed(e) for e in episodes)),  # reward.on_error zero / drop
    }
    if any("agent_splits" in e.metrics for e in episodes):  # agent programs: episodes split into several samples
        out["rollout/agent_splits"] = float(sum(e.metrics.get("agent_splits", 0) for e in episodes
                                                if e.metrics.get("sample_part") == 0))
    for reason in FINISH_REASONS_EPISODE:
        out[f"rollout/finish_{reason}"] = reasons.get(reason, 0) / total
    return out


def _progress(total: int, desc: str):
    """A tqdm bar when stderr is a terminal; None otherwise (logs stay clean)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ep", leave=False)


__all__ = ["RolloutManager", "write_episodes", "write_train_records", "read_episodes", "rollout_metrics",
           "EPISODES_FILE", "TRAIN_RECORDS_FILE"]
