"""The RL loop for tool-using agents (GRPO and the rest of the PPO family), top to bottom.

    for step in 1..total_steps:
        tasks    = sampler.next()                                  (data.train_batch_size prompts)
        episodes = rollout.generate(tasks)                         (rollout.n per prompt, rewards filled in; a
                                                                    reward function that raises stops the run;
                                                                    every policy token's weight version recorded)
        drop infra-failed episodes                                 (counted, never trained as reward 0)
        [drop groups whose reward raised]                          (reward.on_error: drop)
        stop if too many episodes infra-failed                     (trainer.max_infra_failed_fraction, ...)
        [drop zero-variance groups, refill from new tasks]         (algorithm.filter_zero_variance_groups)
        scores = rewards - per-turn rewards [+ overlong penalty]   (reward.overlong_buffer, DAPO)
        batch = episodes_to_batch(..., per-turn rewards)           (an environment's, on each turn's last token)
        old_logprobs = policy(batch)                               (training weights, rollout T; bypass_mode:
                                                                    the rollout logprobs, no recompute; one
                                                                    epoch: from the update's forward, below)
        [ref_logprobs = reference(batch)]                          (actor.use_kl_loss or algorithm.use_kl_in_reward)
        token_rewards = score on the last policy token [+ per-token rewards in the batch]
        [token_rewards -= beta * kl(old, ref)]                     (algorithm.use_kl_in_reward, kl_ctrl)
        [values = critic(batch)]                                   (critic.enable: gae)
        advantages, returns = estimator(token_rewards, mask, uids, values)   (algorithm.adv_estimator)
        [is_weights = pi_old / pi_rollout]                         (algorithm.rollout_correction)
        [truncated responses out of the loss]                      (algorithm.mask_truncated)
        [critic metrics = update_critic(batch)]                    (critic.ppo_epochs x mini x micro-batches)
        actor metrics = update_policy(batch)                       (actor.ppo_epochs x mini x micro-batches)
        sync weights -> engine                                     (shared memory or state dict /
                                                                    update_weights_from_disk)
        log metrics; validate every test_freq; checkpoint every save_freq (policy, critic, kl_ctrl, sampler)
    final_model/ (HF model dir), COMPLETE

`step_phases` is the loop body line by line: each helper returns what it computes (tensors, metrics) and the
step puts it in the batch; `metrics.timed` times every phase. `run` opens Ray, the ranks, the engine, the tools
and the logger on an exit stack, so they close in reverse order however the run ends.

How a run starts in its run_dir (fresh, resumed from a checkpoint, or already complete) and what a resume does
to the directory's records: `agentrl.trainer.resume`. A resume pushes the checkpoint's weights to the engine
before its first step; a fresh run against SGLang servers that serve weights pushed earlier (an earlier run's)
pushes its initial weights first, as version 0 (`foreign_weight_labels`). What the console shows:
`agentrl.trainer.console`. When a run stops on its own (a reward function raised, the tools or engines are down)
and what it says: `agentrl.trainer.stops`.

Entry points: `train(cfg)` (blocking) and `run(cfg)` (async). `agentrl train CONFIG [overrides]` calls `train`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl.agent_loop.calls import split_episode_ids
from agentrl.agent_loop.rewards import reward_failed
from agentrl.agent_loop.versions import as_version
from agentrl.config import save_config, to_dict
from agentrl.console import quiet_third_party
from agentrl.errors import InfraFailureError, WeightSyncError
from agentrl.trainer.algos import (
    AdvantageInputs,
    apply_kl_in_reward,
    make_kl_controller,
    masked_mean,
    overlong_penalty,
    resolve_adv_estimator,
    rollout_is_weights,
    rollout_rejection_mask,
    token_level_rewards,
    turn_level_rewards,
)
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.buffer import GroupBuffer
from agentrl.trainer.checkpoint import (
    begin_checkpoint,
    checkpoint_step,
    commit_checkpoint,
    list_checkpoints,
    load_driver_state,
    prune_checkpoints,
    save_driver_state,
    save_hf_files,
)
from agentrl.trainer.config import DataConfig, TrainConfig
from agentrl.trainer.console import run_header
from agentrl.trainer.metrics import (
    MetricsLogger,
    advantage_metrics,
    drift_metrics,
    episode_metrics,
    per_source_metrics,
    timed,
    value_metrics,
)
from agentrl.trainer.resume import FINAL_MODEL_DIR, RECORDED_PATHS, mark_complete, plan_start, prepare_run_dir
from agentrl.trainer.staleness import filter_stale_groups, staleness_metrics
from agentrl.trainer.stops import InfraLimits, InfraWatch, log_failure, log_line, resume_hint
from agentrl.trainer.weight_sync import foreign_weight_labels, push_weights, write_hf_checkpoint
from agentrl.types import Episode, Task

if TYPE_CHECKING:
    from tensordict import TensorDict


class TaskSampler:
    """Epoch-wise (optionally shuffled) pass over the training tasks; its position is checkpointed."""

    def __init__(self, tasks: list[Task], batch_size: int, *, shuffle: bool, seed: int):
        if not tasks:
            raise ValueError("no training tasks: data.train_files is empty or its files hold no rows")
        self.tasks, self.batch_size, self.shuffle, self.seed = tasks, batch_size, shuffle, seed
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.tasks)))
        return torch.randperm(len(self.tasks), generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def next(self, count: int | None = None) -> list[Task]:
        out = []
        for _ in range(count or self.batch_size):
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self.tasks[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()


def group_by_uid(episodes: list[Episode]) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.uid].append(ep)
    return groups


def has_signal(group: list[Episode]) -> bool:
    """A group teaches something only if its rewards differ (otherwise every GRPO advantage is 0)."""
    return len(group) > 1 and len({ep.reward for ep in group}) > 1


def load_task_files(paths: list[str]) -> list[tuple[Task, str]]:
    """(task, "file:row N") for every row of the files, in order; the origin names the task in errors."""
    from agentrl.data.tasks import TaskFormatError, read_tasks

    rows = []
    for path in paths:
        for number, item in read_tasks(path):
            if isinstance(item, TaskFormatError):
                raise item
            rows.append((item, f"{path}:row {number}"))
    return rows


def round_prompts(wanted: int, data: DataConfig) -> int:
    """Prompts to roll out for `wanted` more groups: oversampled by gen_batch_size / train_batch_size (DAPO), so
    the first round draws gen_batch_size prompts and a refill round as many more in proportion."""
    if not data.gen_batch_size:
        return wanted
    return -(-wanted * data.gen_batch_size // data.train_batch_size)


async def collect_episodes(rollout, sampler: TaskSampler, cfg: TrainConfig,
                           step: int) -> tuple[list[Episode], dict, list[Episode]]:
    """Roll out one step's tasks; drop infra failures, and the groups whose reward raised (`reward.on_error:
    drop`); optionally keep only groups with reward variance, refilling from new tasks (DAPO dynamic sampling)
    for up to `algorithm.max_filter_rounds` extra rounds. Returns (episodes to train on, data stats, every
    episode generated). `data/signal_groups` counts the kept groups whose rewards differ: 0 means the step has
    nothing to learn from."""
    stats = defaultdict(float)
    kept: list[list[Episode]] = []
    all_episodes: list[Episode] = []
    rounds = 1 + (cfg.algorithm.max_filter_rounds if cfg.algorithm.filter_zero_variance_groups else 0)
    for round_index in range(rounds):
        wanted = cfg.data.train_batch_size - len(kept)
        episodes = await rollout.generate(sampler.next(round_prompts(wanted, cfg.data)), step=step)
        for ep in episodes:  # uids restart at task0 each call: make refill rounds distinct groups
            ep.uid = f"{ep.uid}-r{round_index}"
        all_episodes += episodes
        kept += keep_groups(list(group_by_uid(episodes).values()), cfg, stats)
        stats["data/rollout_rounds"] = round_index + 1
        if len(kept) >= cfg.data.train_batch_size:
            break
    return finish_collect(kept, all_episodes, stats, cfg)


def keep_groups(groups: list[list[Episode]], cfg: TrainConfig, stats: defaultdict) -> list[list[Episode]]:
    """The trainable part of finished groups: infra-failed episodes out (counted in `stats`), then the groups
    whose reward raised (`reward.on_error: drop`) and, with `algorithm.filter_zero_variance_groups`, the groups
    without reward variance (counted)."""
    kept = []
    for group in groups:
        stats["data/infra_failed"] += sum(ep.infra_error for ep in group)
        group = [ep for ep in group if not ep.infra_error]
        if not group:
            continue
        if cfg.reward.on_error == "drop" and any(reward_failed(ep) for ep in group):
            stats["data/reward_error_groups"] += 1
            continue
        if not has_signal(group):
            if len(group) > 1:  # a lone episode (rollout.n 1, e.g. PPO with a critic) is no zero-variance group
                stats["data/zero_var_groups"] += 1
            if cfg.algorithm.filter_zero_variance_groups:
                continue
        kept.append(group)
    return kept


def finish_collect(kept: list[list[Episode]], generated: list[Episode], stats: defaultdict,
                   cfg: TrainConfig) -> tuple[list[Episode], dict, list[Episode]]:
    """(episodes of the first train_batch_size kept groups, the step's data stats, every episode generated)."""
    kept = kept[: cfg.data.train_batch_size]
    stats["data/groups"] = len(kept)
    stats["data/signal_groups"] = sum(has_signal(group) for group in kept)
    stats["data/episodes_generated"] = len(generated)
    return [ep for group in kept for ep in group], dict(stats), generated


async def collect_from_buffer(buffer: GroupBuffer, cfg: TrainConfig, step: int,
                              trainer_version: int) -> tuple[list[Episode], dict, list[Episode]]:
    """The async counterpart of `collect_episodes`, round for round: the first round takes the step's
    `buffer.groups_per_step` groups (data.gen_batch_size, else train_batch_size: what sync mode's first round
    draws) as soon as they are finished; infra failures, reward errors and zero-variance groups are handled as in
    sync mode, and a refill round (at most `algorithm.max_filter_rounds`) has the producer submit and takes as
    many more groups as sync mode's would draw (`round_prompts`). Groups more than `trainer.max_staleness`
    versions behind `trainer_version` (the weights the engine serves) are dropped, counted, and replaced one for
    one outside the refill rounds. Writes every taken group to episodes.jsonl under `step`."""
    from agentrl.agent_loop.rollout import EPISODES_FILE, write_episodes

    stats: defaultdict = defaultdict(float)
    kept: list[list[Episode]] = []
    generated: list[Episode] = []
    refills = cfg.algorithm.max_filter_rounds if cfg.algorithm.filter_zero_variance_groups else 0
    take, rounds = buffer.groups_per_step, 0
    while take:
        groups = [group for _, group in await buffer.take(take)]
        generated += [ep for group in groups for ep in group]
        trainable = keep_groups(groups, cfg, stats)
        fresh, stale = filter_stale_groups(trainable, cfg.trainer.max_staleness, trainer_version)
        stats["data/stale_groups_dropped"] += stale
        kept += fresh
        missing = cfg.data.train_batch_size - len(kept)
        if missing <= 0:
            break
        if len(trainable) < len(groups) and rounds < refills:  # a refill round, sized as sync mode's
            rounds += 1
            take = round_prompts(missing, cfg.data)
        else:
            take = min(stale, missing)
        buffer.replace(take)
    stats["data/rollout_rounds"] = rounds + 1
    if cfg.rollout.dump_episodes and generated:
        write_episodes(Path(cfg.trainer.run_dir) / EPISODES_FILE, generated, step=step, n=cfg.rollout.n)
    return finish_collect(kept, generated, stats, cfg)


async def train_step(step: int, cfg: TrainConfig, *, rollout, sampler, workers, engine, pad_token_id: int,
                     critic=None, kl_ctrl=None, infra: InfraWatch | None = None,
                     buffer: GroupBuffer | None = None) -> dict:
    """One RL step; returns its metrics, then its `timing/` seconds and `perf/` rates. `critic`: the value model's
    group when `critic.enable`; `kl_ctrl`: the reward-side KL coefficient when `algorithm.use_kl_in_reward`;
    `infra`: raises InfraFailureError after the rollout, before anything is updated, when too many episodes failed
    for an infrastructure reason; `buffer`: async mode's finished groups (None: sync mode, roll out the step's
    tasks now)."""
    timing: dict[str, float] = {}
    with timed("timing/step_s", timing):
        metrics, batch = await step_phases(step, cfg, timing, rollout=rollout, sampler=sampler, workers=workers,
                                           engine=engine, pad_token_id=pad_token_id, critic=critic, kl_ctrl=kl_ctrl,
                                           infra=infra, buffer=buffer)
    if batch is not None:
        timing.update(step_rates(timing, batch, cfg))
    if buffer is not None:
        buffer.step_done(step)
        metrics.update(buffer.metrics())
    if callable(getattr(engine, "metrics", None)):  # engine replicas: requests retried, replicas restarted and up
        metrics.update(engine.metrics())
    return {**metrics, **timing}


async def step_phases(step: int, cfg: TrainConfig, timing: dict[str, float], *, rollout, sampler, workers, engine,
                      pad_token_id: int, critic, kl_ctrl, infra: InfraWatch | None,
                      buffer: GroupBuffer | None = None) -> tuple[dict, TensorDict | None]:
    """The module docstring's pseudo-code, line by line; each phase's seconds go to `timing`. Returns (metrics,
    the batch the update trained on), or (metrics, None) when there was nothing to train on. The trainer's passes
    run in a thread, so that in async mode the episodes in flight go on meanwhile."""
    from agentrl.agent_loop.rollout import rollout_metrics, write_train_records

    alg = cfg.algorithm
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0  # greedy logprobs are T=1
    with timed("timing/rollout_s", timing):  # async mode: the wait for finished groups
        if buffer is None:
            episodes, data_stats, generated = await collect_episodes(rollout, sampler, cfg, step)
        else:
            episodes, data_stats, generated = await collect_from_buffer(buffer, cfg, step, serving_version(engine))
    if infra is not None:
        infra.check(step, generated)
    metrics = {**data_stats, **rollout_metrics(generated), **episode_metrics(episodes),
               **staleness_metrics(generated, serving_version(engine))}
    if not episodes:  # nothing trainable this step (all infra failures or all zero-variance): skip the update
        return {**metrics, "data/skipped_update": 1.0}, None

    with timed("timing/batch_s", timing):
        scores_B, score_stats = episode_scores(episodes, cfg)
        batch = episodes_to_batch(episodes, pad_token_id, token_rewards=episode_turn_rewards(episodes))
    metrics.update(score_stats)
    reuse_old = reuses_old_logprobs(cfg)  # then pi_old comes from the update's own forward, below
    if alg.rollout_correction.bypass_mode:  # pi_old is the rollout policy
        batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    elif not reuse_old:
        with timed("timing/old_logprob_s", timing):
            batch["old_logprobs"], _ = await asyncio.to_thread(workers.compute_logprobs, batch,
                                                               temperature=temperature)
    if needs_reference(cfg):
        with timed("timing/ref_logprob_s", timing):
            batch["ref_logprobs"], _ = await asyncio.to_thread(workers.compute_logprobs, batch,
                                                               temperature=temperature, ref=True)

    mask = batch["loss_mask"]  # the rollout's: rewards and advantages live on it
    token_rewards = step_token_rewards(scores_B, batch)
    if alg.use_kl_in_reward:
        token_rewards, kl_stats = apply_kl_in_reward(token_rewards, batch["old_logprobs"], batch["ref_logprobs"],
                                                     mask, kl_ctrl.value, alg.kl_penalty)
        kl_ctrl.update(kl_stats["actor/reward_kl_penalty"], n_steps=len(episodes))
        metrics.update(kl_stats)
    if critic is not None:
        with timed("timing/values_s", timing):
            batch["values"] = await asyncio.to_thread(critic.compute_values, batch)
    estimated = estimate_advantages(token_rewards, batch, episodes, alg)
    batch.update(estimated)
    metrics.update(advantage_metrics(batch["advantages"], mask))
    train_critic = critic is not None and "returns" in estimated  # a critic learns from the estimator's returns
    if train_critic:
        metrics.update(value_metrics(batch["values"], batch["returns"], mask))

    in_update = in_update_correction(cfg)  # else the weights (and rejections) from pi_old, computed above
    corrected, corr_stats = ({}, {}) if in_update else rollout_correction(batch, alg.rollout_correction)
    batch.update(corrected)
    batch["loss_mask"], truncated_stats = mask_truncated(batch["loss_mask"], episodes, enabled=alg.mask_truncated)
    metrics.update({**corr_stats, **truncated_stats})
    if not bool(batch["loss_mask"].any()):  # every trajectory was left out of the loss
        return {**metrics, "data/skipped_update": 1.0}, None

    update_seed = cfg.trainer.seed * 1_000_003 + step
    if train_critic:
        with timed("timing/critic_update_s", timing):
            critic_out = await asyncio.to_thread(critic.update_critic, batch,
                                                 **update_options(cfg.critic, cfg.rollout.n, update_seed))
        metrics.update(prefixed("critic/", critic_out))
    with timed("timing/update_s", timing):  # reuse_old: the update also puts pi_old in batch["old_logprobs"]
        actor_out = await asyncio.to_thread(workers.update_policy, batch, temperature=temperature,
                                            reuse_old_logprobs=reuse_old, is_correction=in_update,
                                            **update_options(cfg.actor, cfg.rollout.n, update_seed))
    metrics.update(prefixed("actor/", actor_out))
    if in_update:  # the weights the loss used, from the pi_old the update wrote back: their metrics
        metrics.update(rollout_correction(batch, alg.rollout_correction)[1])
    if not alg.rollout_correction.bypass_mode:  # reused pi_old exists only on the trained tokens
        metrics.update(drift_metrics(batch["rollout_logprobs"], batch["old_logprobs"],
                                     batch["loss_mask"] if reuse_old else mask, batch["turn_ids"],
                                     max_turns=cfg.agent.max_assistant_turns))
    if cfg.rollout.dump_episodes:  # advantages and trainer logprobs per token, for `agentrl view`
        write_train_records(cfg.trainer.run_dir, step, episodes, masked_mean(batch["advantages"], mask, dim=1),
                            batch["old_logprobs"])
    with timed("timing/sync_s", timing):
        metrics.update(await push_weights(workers, engine, cfg, step, during_rollout=buffer is not None))
    return metrics, batch


TRAINER_TIMINGS = ("timing/old_logprob_s", "timing/ref_logprob_s", "timing/values_s", "timing/critic_update_s",
                   "timing/update_s")
TRUNCATED = "length"  # Episode.finish_reason of a response cut by a length budget


def serving_version(engine) -> int | None:
    """The weight version the engine serves now: the step of the trainer's last push (`sync_weights`), so versions
    read the same after a resume. None when the engine does not say. In sync mode nothing is pushed during a
    rollout, so this is also the version that sampled the step."""
    return as_version(getattr(engine, "weight_version", None))


def reuses_old_logprobs(cfg: TrainConfig) -> bool:
    """pi_old comes from the update's first forward (no separate pass) when nothing needs it before the update:
    one PPO epoch, no reward-side KL (it shapes the rewards from pi_old), not bypass mode (pi_old is pi_rollout
    there), no rejection and no sequence-level correction (they need whole trajectories' pi_old before the
    loss). Token-level correction weights are computed inside the update from its own pi_old
    (`in_update_correction`)."""
    alg = cfg.algorithm
    corr = alg.rollout_correction
    return (cfg.actor.reuse_old_logprobs and cfg.actor.ppo_epochs == 1 and not alg.use_kl_in_reward
            and not corr.bypass_mode and corr.level in (None, "token") and corr.rejection.level is None)


def in_update_correction(cfg: TrainConfig) -> tuple | None:
    """(level, threshold, mode) of a token-level rollout correction the update computes from its own pi_old
    (`reuses_old_logprobs`); None when there is none, or the driver computes it before the update."""
    corr = cfg.algorithm.rollout_correction
    if corr.level is None or not reuses_old_logprobs(cfg):
        return None
    return corr.level, corr.is_threshold, corr.mode


def needs_reference(cfg: TrainConfig) -> bool:
    """The frozen reference policy is loaded for the loss-side KL and for the reward-side KL."""
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def episode_scores(episodes: list[Episode], cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """[B] outcome scores: each episode's reward less the per-turn rewards it holds (those go on their turns'
    tokens, `episode_turn_rewards`), plus DAPO's overlong penalty when `reward.overlong_buffer` is on (L = the
    episode's response tokens, budget `agent.max_response_tokens`)."""
    scores_B = torch.tensor([ep.reward - sum(ep.turn_rewards) for ep in episodes], dtype=torch.float32)
    buffer = cfg.reward.overlong_buffer
    if not buffer.enable:
        return scores_B, {}
    penalty_B = overlong_penalty([len(ep.response_ids) for ep in episodes], cfg.agent.max_response_tokens,
                                 buffer.len, buffer.penalty_factor)
    return scores_B + penalty_B, {"reward/overlong_penalty_mean": float(penalty_B.mean()),
                                  "reward/overlong_frac": float((penalty_B < 0).float().mean())}


def episode_turn_rewards(episodes: list[Episode]) -> list[list[float]] | None:
    """Per episode, one reward per response token: its environment's per-turn rewards on each turn's last policy
    token (`turn_level_rewards`); None when no episode has any."""
    if not any(ep.turn_rewards for ep in episodes):
        return None
    return [turn_level_rewards(ep.turn_rewards, ep.turn_ids, ep.response_mask) if ep.turn_rewards
            else [0.0] * len(ep.response_ids) for ep in episodes]


def step_token_rewards(scores_B: torch.Tensor, batch: TensorDict) -> torch.Tensor:
    """[B, L] token rewards: each row's score on its last policy token, plus the batch's per-token rewards (e.g.
    per turn) when it has them."""
    token_rewards = token_level_rewards(scores_B, batch["loss_mask"])
    if "token_rewards" in batch.keys():
        token_rewards = token_rewards + batch["token_rewards"]
    return token_rewards


def estimate_advantages(token_rewards_B_L: torch.Tensor, batch: TensorDict, episodes: list[Episode],
                        alg) -> dict[str, torch.Tensor]:
    """`algorithm.adv_estimator` over the batch's groups (episode uids), with the critic's values when the batch
    has them: {"advantages": [B, L]}, plus "returns" [B, L] from an estimator that has them (gae); 0 off the loss
    mask."""
    mask = batch["loss_mask"]
    adv, returns = resolve_adv_estimator(alg.adv_estimator)(AdvantageInputs(
        token_rewards_B_T=token_rewards_B_L, mask_B_T=mask, group_ids=[ep.uid for ep in episodes],
        values_B_T=batch["values"] if "values" in batch.keys() else None, gamma=alg.gamma, lam=alg.lam,
        norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo, episode_ids=split_episode_ids(episodes)))
    out = {"advantages": adv.float() * mask}
    if returns is not None:
        out["returns"] = returns.float() * mask
    return out


def rollout_correction(batch: TensorDict, corr) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """`algorithm.rollout_correction` from log(pi_old / pi_rollout) on the batch's loss tokens. Returns (the
    tensors to put in the batch, their metrics): "rollout_is_weights" [B, L], importance weights for the
    policy-gradient token losses, and/or "loss_mask" [B, L] with the rejected tokens or trajectories taken out.
    In bypass mode pi_old is pi_rollout, so there is nothing to correct."""
    tensors: dict[str, torch.Tensor] = {}
    stats: dict[str, float] = {}
    if corr.level is None and corr.rejection.level is None:
        return tensors, stats
    log_ratio = batch["old_logprobs"] - batch["rollout_logprobs"]
    if corr.level is not None:
        tensors["rollout_is_weights"], is_stats = rollout_is_weights(log_ratio, batch["loss_mask"], corr.level,
                                                                     corr.is_threshold, mode=corr.mode)
        stats.update(is_stats)
    if corr.rejection.level is not None:
        tensors["loss_mask"], rejection_stats = rollout_rejection_mask(log_ratio, batch["loss_mask"],
                                                                       corr.rejection.level, corr.rejection.lower,
                                                                       corr.rejection.upper)
        stats.update(rejection_stats)
    return tensors, stats


def mask_truncated(loss_mask_B_L: torch.Tensor, episodes: list[Episode], *,
                   enabled: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """Count responses cut by a length budget; with `enabled` (algorithm.mask_truncated) leave them out of the
    loss (they still took part in the advantages of their group). Returns (the loss mask [B, L], with their rows
    zeroed when enabled, the metrics)."""
    truncated_B = torch.tensor([ep.finish_reason == TRUNCATED for ep in episodes])
    stats = {"data/truncated_frac": float(truncated_B.float().mean())}
    if not enabled:
        return loss_mask_B_L, stats
    stats["data/masked_truncated"] = float(truncated_B.sum())
    return loss_mask_B_L * (~truncated_B)[:, None].to(loss_mask_B_L.dtype), stats


def update_options(role, n: int, seed: int) -> dict:
    """The PPO-update keywords of the policy (`actor`) or the critic (`critic`): mini-batches count prompts, so
    a mini-batch holds ppo_mini_batch_size x rollout.n trajectories."""
    return {"mini_batch_size": role.ppo_mini_batch_size * n, "epochs": role.ppo_epochs, "shuffle": role.shuffle,
            "seed": seed}


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in metrics.items()}


def step_rates(timing: dict[str, float], batch: TensorDict, cfg: TrainConfig) -> dict[str, float]:
    """A trained step's share of `timing/step_s` spent outside the rollout and the trainer passes, and its
    throughputs (tokens per second) from the phase seconds in `timing`."""
    tokens = int(batch["seq_lens"].sum())
    trainer_s = sum(timing.get(k, 0.0) for k in TRAINER_TIMINGS)
    step_s = timing["timing/step_s"]
    rates = {"timing/driver_overhead_frac": (step_s - timing["timing/rollout_s"] - trainer_s) / step_s,
             "perf/update_tokens_per_s": tokens * cfg.actor.ppo_epochs / max(timing["timing/update_s"], 1e-9)}
    if "timing/critic_update_s" in timing:
        rates["perf/critic_update_tokens_per_s"] = tokens * cfg.critic.ppo_epochs / max(
            timing["timing/critic_update_s"], 1e-9)
    rates["perf/rollout_model_tokens_per_s"] = float(batch["loss_mask"].sum()) / max(timing["timing/rollout_s"], 1e-9)
    rates["perf/batch_tokens"] = float(tokens)
    return rates


async def validate(val_rollout, tasks: list[Task], step: int) -> dict[str, float]:
    timing: dict[str, float] = {}
    with timed("timing/val_s", timing):
        episodes = await val_rollout.generate(tasks, step=step)
        ok = [ep for ep in episodes if not ep.infra_error]
        metrics = {**episode_metrics(ok, prefix="val/"), **per_source_metrics(ok, prefix="val/"),
                   "val/infra_failed": float(len(episodes) - len(ok)), "val/episodes": float(len(episodes))}
    return {**metrics, **timing}


def save_checkpoint(cfg: TrainConfig, workers, sampler: TaskSampler | GroupBuffer, step: int, *, critic=None,
                    kl_ctrl=None) -> Path:
    """Sharded weights and optimizer (policy, and critic when there is one), driver state (step, sampler,
    reward-KL coefficient), the config and the model's HF files (layout: checkpoint.py). In async mode `sampler`
    is the GroupBuffer: the position saved is that of the oldest group not trained yet (`sampler_state`), with
    that group's index (`checkpoint_state`)."""
    tmp = begin_checkpoint(cfg.trainer.run_dir, step)
    workers.save_checkpoint(tmp)
    if critic is not None:
        critic.save_checkpoint(tmp)
    if isinstance(sampler, GroupBuffer):
        driver = {"step": step, "sampler": sampler.sampler_state(), "groups": sampler.checkpoint_state()}
    else:
        driver = {"step": step, "sampler": sampler.state_dict()}
    if kl_ctrl is not None:
        driver["kl_ctrl"] = kl_ctrl.state_dict()
    save_driver_state(tmp, driver)
    save_config(cfg, tmp, path_keys=RECORDED_PATHS)
    save_hf_files(tmp, cfg.model.path, cfg.model.tokenizer_path)
    final = commit_checkpoint(tmp, step)
    prune_checkpoints(cfg.trainer.run_dir, cfg.trainer.keep_checkpoints)
    return final


def save_stop_checkpoint(cfg: TrainConfig, workers, sampler: TaskSampler | GroupBuffer, step: int, *, critic=None,
                         kl_ctrl=None) -> int | None:
    """After an infrastructure stop: the step a rerun resumes after, `step` (the last one completed), saving its
    checkpoint unless run_dir has one; None when no step was completed."""
    if step < 1:
        return None
    if all(checkpoint_step(path) != step for path in list_checkpoints(cfg.trainer.run_dir)):
        save_checkpoint(cfg, workers, sampler, step, critic=critic, kl_ctrl=kl_ctrl)
    return step


def _seed_everything(cfg: TrainConfig) -> TrainConfig:
    random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    if cfg.trainer.deterministic:
        torch.use_deterministic_algorithms(True)
        if cfg.rollout.seed is None:  # seeded sampling: the same step draws the same episodes after a resume
            cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"seed": cfg.trainer.seed})})
    return cfg


def _header(cfg: TrainConfig, num_tasks: int) -> str:
    return run_header("train", {
        "run dir": cfg.trainer.run_dir, "model": cfg.model.path,
        "tasks": f"{num_tasks} ({', '.join(cfg.data.train_files)})", "steps": cfg.trainer.total_steps,
        "batch": f"{cfg.data.train_batch_size} prompts x {cfg.rollout.n} episodes",
        "engine": cfg.engine.backend, "world size": cfg.actor.world_size,
        "algorithm": cfg.algorithm.adv_estimator + (" + critic" if cfg.critic.enable else "")})


async def open_trainer(cfg: TrainConfig, resources: contextlib.AsyncExitStack) -> tuple:
    """(policy ranks, critic ranks or None, engine, started tool registry); each is pushed on `resources` to
    close as soon as it is open, so a failure halfway closes what was opened before it."""
    from agentrl.inference import make_engine
    from agentrl.tools.client import ToolRegistry
    from agentrl.trainer.critic import CriticGroup, critic_model
    from agentrl.trainer.worker import WorkerGroup

    workers = WorkerGroup(cfg.model, cfg.actor, with_ref=needs_reference(cfg), total_steps=cfg.trainer.total_steps,
                          seed=cfg.trainer.seed, deterministic=cfg.trainer.deterministic)
    resources.callback(workers.shutdown)
    critic = None
    if cfg.critic.enable:
        critic = CriticGroup(critic_model(cfg.model, cfg.critic.model.path), cfg.critic,
                             total_steps=cfg.trainer.total_steps, seed=cfg.trainer.seed,
                             deterministic=cfg.trainer.deterministic)
        resources.callback(critic.shutdown)
    engine = make_engine(cfg.engine, cfg.model.path)
    if getattr(engine, "close", None) is not None:  # LocalEngine and SGLangEngine close their threads / clients
        resources.push_async_callback(engine.close)
    tools = ToolRegistry.from_tools_config(cfg.tools)
    resources.push_async_callback(tools.aclose)
    await tools.start()  # discover remote tool schemas now: a missing service fails before any rollout
    return workers, critic, engine, tools


def restore_checkpoint(checkpoint: Path, workers, sampler: TaskSampler, *, critic=None,
                       kl_ctrl=None) -> dict | None:
    """Load a checkpoint's policy (and critic) weights and optimizers, the sampler's position and the reward-KL
    coefficient (absent when the checkpoint's run had no reward KL). Returns the async buffer's state
    (`GroupBuffer.checkpoint_state`; None when the checkpoint's run was in sync mode)."""
    workers.load_checkpoint(checkpoint)
    if critic is not None:
        critic.load_checkpoint(checkpoint)
    driver = load_driver_state(checkpoint)
    sampler.load_state_dict(driver["sampler"])
    if kl_ctrl is not None and "kl_ctrl" in driver:
        kl_ctrl.load_state_dict(driver["kl_ctrl"])
    return driver.get("groups")


async def start_buffer(cfg: TrainConfig, rollout, sampler: TaskSampler, trained_steps: int,
                       resources: contextlib.AsyncExitStack, resume_from: dict | None = None) -> GroupBuffer | None:
    """Async mode: the producer of finished groups, started now and cancelled when the run ends (its episodes in
    flight and buffered are lost: a resume regenerates them from the checkpoint's sampler position, under the
    group indices `resume_from` names). Sync mode: None."""
    if cfg.trainer.mode == "sync":
        return None
    buffer = GroupBuffer(rollout, sampler, groups_per_step=cfg.data.gen_batch_size or cfg.data.train_batch_size,
                         max_staleness=cfg.trainer.max_staleness, max_episodes=cfg.rollout.max_concurrent_episodes,
                         group_size=cfg.rollout.n, trained_steps=trained_steps,
                         total_steps=cfg.trainer.total_steps, resume_from=resume_from)
    resources.push_async_callback(buffer.close)
    buffer.start()
    return buffer


async def run(cfg: TrainConfig) -> dict[str, float]:
    """Train; returns the metrics of the last step this call ran ({} when the run was already complete).
    Resumes from `trainer.resume` (default: latest checkpoint). Everything it opens (Ray when it started it, the
    policy and critic ranks, the engine, the tool registry, the metrics logger) closes in reverse order however
    the run ends."""
    from transformers import AutoTokenizer

    from agentrl.agent_loop.rollout import RolloutManager
    from agentrl.trainer.worker import start_ray

    quiet_third_party()
    cfg = _seed_everything(cfg)
    run_dir = Path(cfg.trainer.run_dir)
    start = plan_start(cfg)  # checks a resume against the checkpoint's config before anything is written
    if start.complete:
        print(f"run already complete at step {start.step} in {run_dir}, with this config (a larger "
              "trainer.total_steps trains on; another trainer.run_dir or trainer.resume=never starts over)", flush=True)
        return {}
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_rows = load_task_files(cfg.data.train_files)
    val_rows = load_task_files(cfg.data.val_files)[: cfg.data.val_batch_size]
    sampler = TaskSampler([task for task, _ in train_rows], cfg.data.train_batch_size,
                          shuffle=cfg.data.shuffle, seed=cfg.data.seed)
    val_tasks = [task for task, _ in val_rows]
    print(_header(cfg, len(sampler.tasks)), flush=True)
    for note in prepare_run_dir(cfg, start):
        print(note, flush=True)
    log_line(run_dir, f"start after step {start.step}" + (f" ({start.checkpoint})" if start.checkpoint else ""))

    async with contextlib.AsyncExitStack() as resources:
        if start_ray(cfg.trainer.ray_address, cfg.trainer.ray_num_cpus):  # a Ray this run started stops with it
            import ray

            resources.callback(ray.shutdown)
        kl = cfg.algorithm.kl_ctrl
        kl_ctrl = make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon) \
            if cfg.algorithm.use_kl_in_reward else None
        try:
            workers, critic, engine, tools = await open_trainer(cfg, resources)
            rollout = RolloutManager(engine, tokenizer, tools, cfg.agent, cfg.rollout, cfg.reward, run_dir=run_dir)
            val_rollout = RolloutManager(engine, tokenizer, tools, cfg.agent, cfg.rollout.model_copy(update=dict(
                n=cfg.trainer.val_n, temperature=cfg.trainer.val_temperature, dump_episodes=False)),
                cfg.reward, run_dir=None)
            resources.push_async_callback(rollout.aclose)  # an agent program's policy front
            resources.push_async_callback(val_rollout.aclose)
            logger = MetricsLogger(run_dir, cfg.trainer.loggers, project=cfg.trainer.project,
                                   experiment=cfg.trainer.experiment, config=to_dict(cfg),
                                   total_steps=cfg.trainer.total_steps, resumed_from=start.step)
            resources.callback(logger.close)

            groups = None  # the async buffer's state in the checkpoint
            if start.checkpoint is not None:
                groups = restore_checkpoint(start.checkpoint, workers, sampler, critic=critic, kl_ctrl=kl_ctrl)
                await push_weights(workers, engine, cfg, start.step)  # the resumed weights, within the timeout
            elif labels := await foreign_weight_labels(engine, cfg):
                print(f"the engine's servers serve weight versions {labels} pushed before this run: pushing the "
                      "run's initial weights (version 0) first", flush=True)
                await push_weights(workers, engine, cfg, 0, merged=True)  # the base weights, adapters or not
            if val_tasks and cfg.trainer.test_freq and start.step == 0:
                logger.log(0, await validate(val_rollout, val_tasks, 0))
            metrics: dict[str, float] = {}
            infra = InfraWatch(InfraLimits.of(cfg.trainer), services={b.name: b.where for b in tools.backends})
            buffer = await start_buffer(cfg, rollout, sampler, start.step, resources, groups)  # None: sync mode
            position = sampler if buffer is None else buffer  # what a checkpoint saves the sampler's position of
            for step in range(start.step + 1, cfg.trainer.total_steps + 1):
                sampler_at_start = sampler.state_dict()
                try:
                    metrics = await train_step(step, cfg, rollout=rollout, sampler=sampler, workers=workers,
                                               engine=engine, pad_token_id=pad_token_id, critic=critic,
                                               kl_ctrl=kl_ctrl, infra=infra, buffer=buffer)
                except InfraFailureError as stop:  # before the step's update (a weight push: after it)
                    done = step if isinstance(stop, WeightSyncError) else step - 1
                    if buffer is None and done < step:
                        sampler.load_state_dict(sampler_at_start)
                    done = save_stop_checkpoint(cfg, workers, position, done, critic=critic, kl_ctrl=kl_ctrl)
                    raise resume_hint(stop, done, run_dir, auto=cfg.trainer.resume == "auto") from stop
                last = step == cfg.trainer.total_steps
                if val_tasks and cfg.trainer.test_freq and (step % cfg.trainer.test_freq == 0 or last):
                    metrics.update(await validate(val_rollout, val_tasks, step))
                if cfg.trainer.save_freq and (step % cfg.trainer.save_freq == 0 or last):
                    with timed("timing/save_s", metrics):
                        save_checkpoint(cfg, workers, position, step, critic=critic, kl_ctrl=kl_ctrl)
                logger.log(step, metrics)
            if cfg.trainer.save_hf_model:
                # Loadable with AutoModelForCausalLM / `agentrl eval --model`, like any other HF model dir.
                out = write_hf_checkpoint(workers.full_state_dict(), cfg.model.path, run_dir / FINAL_MODEL_DIR)
                print(f"saved the trained policy to {out}", flush=True)
            mark_complete(run_dir, max(start.step, cfg.trainer.total_steps))
            log_line(run_dir, f"complete at step {cfg.trainer.total_steps}")
            return metrics
        except Exception as e:  # the console gets one line (agentrl.cli); the traceback goes to run_dir/train.log
            log_failure(run_dir, e, train_rows + val_rows)
            raise


def train(cfg: TrainConfig) -> dict[str, float]:
    return asyncio.run(run(cfg))


__all__ = [
    "TaskSampler",
    "collect_episodes",
    "foreign_weight_labels",
    "group_by_uid",
    "episode_scores",
    "episode_turn_rewards",
    "has_signal",
    "mask_truncated",
    "needs_reference",
    "reuses_old_logprobs",
    "rollout_correction",
    "run",
    "save_checkpoint",
    "save_stop_checkpoint",
    "train",
    "train_step",
    "validate",
]
