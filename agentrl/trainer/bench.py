"""Update-phase throughput: length-sorted micro-batches trimmed to their longest row vs naive full padding,
or (`--critic`) the PPO update with and without a critic, or (`--shared-prompt`) GRPO groups whose prompt runs
once (`actor.share_prompt_prefix`) against every row run whole.

    agentrl bench train                                  # tiny model built in a temp dir, 32 ragged sequences
    agentrl bench train --model runs/tiny-model --sequences 64 --min-len 16 --max-len 512 --repeats 3
    agentrl bench train --critic                         # policy update vs value-model update, same batch
    agentrl bench train --shared-prompt 265 --sequences 64 --min-len 60 --max-len 130   # the quickstart's shape

Both strategies get the same padded-token memory budget per forward (`--micro-rows` x the longest row) and
the same batch (ragged lengths drawn uniformly from [min-len, max-len]); tokens/s counts real tokens only.
Runs one in-process FSDP2 rank (gloo), so it measures the padding strategy, not communication. The two
strategies alternate (median of `--repeats` each, after a warm-up round) so a change in machine load hits both.
With `--critic` the policy update and the critic update (a value model with the policy's body, the same
micro-batch budget and bucket strategy) alternate the same way, and the bench prints the critic update's time
over the policy update's. With `--shared-prompt L` the sequences come in groups of `--group-size` that share an
L-token prompt before responses of `--min-len` to `--max-len` tokens (all policy tokens), and the two sides are
two in-process ranks that differ only in actor.share_prompt_prefix (one micro-batch per mini-batch, as the
quickstart's budget gives): the update (forward + backward + step) and a no-grad logprob pass (the reference's).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model dir (default: build the tiny model in a temp dir)")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--micro-rows", type=int, default=4, help="rows per micro-batch of the naive strategy")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per strategy (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared machine more threads mostly measure contention)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--critic", action="store_true",
                        help="time the critic update against the policy update instead of the padding strategies")
    parser.add_argument("--shared-prompt", type=int, default=0, metavar="L",
                        help="groups sharing an L-token prompt: actor.share_prompt_prefix on vs off")
    parser.add_argument("--group-size", type=int, default=8, help="rows per prompt with --shared-prompt (default 8)")


def ragged_episodes(count: int, min_len: int, max_len: int, vocab: int, seed: int):
    """`count` episodes of lengths drawn uniformly from [min_len, max_len]: an 8-token prompt (less when the
    length is shorter), the rest policy tokens; groups of 4, random rewards."""
    from agentrl.types import Episode

    rng = random.Random(seed)
    out = []
    for i in range(count):
        total = rng.randint(min_len, max_len)
        prompt = min(8, total - 1)
        resp = total - prompt
        out.append(Episode(uid=f"g{i // 4}", prompt_ids=[rng.randrange(3, vocab) for _ in range(prompt)],
                           response_ids=[rng.randrange(3, vocab) for _ in range(resp)], response_mask=[1] * resp,
                           response_logprobs=[-7.0] * resp, messages=[], reward=float(rng.random() < 0.5)))
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from agentrl.trainer.batch import episodes_to_batch, plan_micro_batches
    from agentrl.trainer.config import ActorConfig, ModelConfig
    from agentrl.trainer.worker import WorkerGroup

    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = None
    model_path = args.model
    if model_path is None:
        from agentrl.models.tiny import build_tiny_model

        tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-train-")
        model_path = str(build_tiny_model(tmp.name))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    if args.shared_prompt:
        try:
            return _shared_prompt(args, model_path, vocab)
        finally:
            if tmp is not None:
                tmp.cleanup()
    eps = ragged_episodes(args.sequences, args.min_len, args.max_len, vocab, args.seed)
    adv = [random.Random(args.seed + 1).choice([-1.0, 1.0]) for _ in eps]
    batch = episodes_to_batch(eps, pad_token_id=0, advantages=adv)
    lens = batch["seq_lens"].tolist()
    real_tokens = sum(lens)
    budget = args.micro_rows * max(lens)
    actor = ActorConfig(lr=1e-6, ppo_micro_batch_size=args.micro_rows, max_tokens_per_micro_batch=budget)
    group = WorkerGroup(ModelConfig(path=model_path), actor, total_steps=100, use_ray=False)
    if args.critic:
        try:
            return _critic_vs_policy(args, group, batch, budget)
        finally:
            group.shutdown()
            if tmp is not None:
                tmp.cleanup()
    try:
        batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
        strategies = ("full", "bucket")
        times: dict[str, list[float]] = {s: [] for s in strategies}
        for repeat in range(args.repeats + 1):  # interleaved, so load changes hit both alike; round 0 warms up
            for strategy in strategies:
                t0 = time.perf_counter()
                group.update_policy(batch, temperature=1.0, mini_batch_size=len(eps), shuffle=False,
                                    strategy=strategy)
                if repeat:
                    times[strategy].append(time.perf_counter() - t0)
        results = {}
        for strategy in strategies:
            plan = plan_micro_batches(lens, world_size=1, max_tokens=budget, max_rows=args.micro_rows,
                                      strategy=strategy)
            results[strategy] = (statistics.median(times[strategy]), plan.padded_tokens(), plan.num_micro_batches)
    finally:
        group.shutdown()
        if tmp is not None:
            tmp.cleanup()
    print(f"update phase: {args.sequences} sequences, lengths {args.min_len}-{args.max_len}, {real_tokens} real "
          f"tokens, budget {budget} padded tokens per forward, median of {args.repeats}")
    print(f"{'strategy':<10}{'micro-batches':>15}{'padded tokens':>15}{'padding %':>11}{'seconds':>10}{'tokens/s':>11}")
    for strategy, (seconds, padded, micro) in results.items():
        print(f"{strategy:<10}{micro:>15}{padded:>15}{100 * (1 - real_tokens / padded):>10.1f}%{seconds:>10.2f}"
              f"{real_tokens / seconds:>11.0f}")
    speedup = results["full"][0] / results["bucket"][0]
    print(f"bucket / full throughput: {speedup:.2f}x")
    return 0


def _critic_vs_policy(args: argparse.Namespace, policy, batch, budget: int) -> int:
    """Alternate one policy update and one critic update on `batch` (median of `--repeats` each)."""
    from agentrl.trainer.config import CriticConfig
    from agentrl.trainer.critic import CriticGroup

    critic_cfg = CriticConfig(lr=1e-6, ppo_micro_batch_size=args.micro_rows, max_tokens_per_micro_batch=budget,
                              loss_agg_mode="token-mean")
    critic = CriticGroup(policy.model_cfg, critic_cfg, total_steps=100, use_ray=False)
    try:
        batch["old_logprobs"], _ = policy.compute_logprobs(batch, temperature=1.0)
        batch["values"] = critic.compute_values(batch)
        batch["returns"] = batch["advantages"] + batch["values"]
        size = batch.batch_size[0]
        times: dict[str, list[float]] = {"policy": [], "critic": []}
        for repeat in range(args.repeats + 1):  # round 0 warms up
            t0 = time.perf_counter()
            policy.update_policy(batch, temperature=1.0, mini_batch_size=size, shuffle=False)
            t1 = time.perf_counter()
            critic.update_critic(batch, mini_batch_size=size, shuffle=False)
            t2 = time.perf_counter()
            if repeat:
                times["policy"].append(t1 - t0)
                times["critic"].append(t2 - t1)
    finally:
        critic.shutdown()
    real_tokens = int(batch["seq_lens"].sum())
    policy_s, critic_s = statistics.median(times["policy"]), statistics.median(times["critic"])
    print(f"update phase with a critic: {args.sequences} sequences, lengths {args.min_len}-{args.max_len}, "
          f"{real_tokens} real tokens, budget {budget} padded tokens per forward, median of {args.repeats}")
    print(f"{'update':<24}{'seconds':>10}{'tokens/s':>11}")
    for name, seconds in (("policy (no critic)", policy_s), ("critic", critic_s),
                          ("policy + critic", policy_s + critic_s)):
        print(f"{name:<24}{seconds:>10.2f}{real_tokens / seconds:>11.0f}")
    ratio = critic_s / policy_s
    print(f"critic / policy update time: {ratio:.2f}x (critic {critic_s:.2f} s against the policy's {policy_s:.2f} s)")
    return 0


def _grouped_episodes(args: argparse.Namespace, vocab: int):
    from agentrl.types import Episode

    rng = random.Random(args.seed)
    out, prompt = [], []
    for i in range(args.sequences):
        if i % args.group_size == 0:
            prompt = [rng.randrange(3, vocab) for _ in range(args.shared_prompt)]
        resp = rng.randint(args.min_len, args.max_len)
        out.append(Episode(uid=f"g{i // args.group_size}", prompt_ids=list(prompt),
                           response_ids=[rng.randrange(3, vocab) for _ in range(resp)], response_mask=[1] * resp,
                           response_logprobs=[-7.0] * resp, messages=[], reward=float(rng.random() < 0.5)))
    return out


def _shared_prompt(args: argparse.Namespace, model_path: str, vocab: int) -> int:
    """Alternate the two sides (share_prompt_prefix on / off) on one batch of grouped rows."""
    import torch

    from agentrl.trainer.batch import episodes_to_batch, split_shared_prefixes
    from agentrl.trainer.config import ActorConfig, ModelConfig
    from agentrl.trainer.worker import WorkerGroup

    eps = _grouped_episodes(args, vocab)
    adv = [random.Random(args.seed + 1).choice([-1.0, 1.0]) for _ in eps]
    batch = episodes_to_batch(eps, pad_token_id=0, advantages=adv)
    real_tokens = int(batch["seq_lens"].sum())
    saved = split_shared_prefixes(batch["input_ids"], batch["loss_mask"].bool(), batch["seq_lens"]).saved_tokens
    sides = {"whole rows": False, "shared prompt": True}
    groups = {name: WorkerGroup(ModelConfig(path=model_path),
                                ActorConfig(lr=1e-6, max_tokens_per_micro_batch=None, ppo_micro_batch_size=len(eps),
                                            share_prompt_prefix=flag), total_steps=100, use_ray=False)
              for name, flag in sides.items()}
    times: dict[tuple[str, str], list[float]] = {(name, phase): [] for name in sides for phase in ("update", "logprob")}
    try:
        batch["old_logprobs"], _ = groups["whole rows"].compute_logprobs(batch, temperature=1.0)
        for repeat in range(args.repeats + 1):  # interleaved, so load changes hit both alike; round 0 warms up
            for name, group in groups.items():
                t0 = time.perf_counter()
                group.compute_logprobs(batch, temperature=1.0)
                t1 = time.perf_counter()
                group.update_policy(batch, temperature=1.0, mini_batch_size=len(eps), shuffle=False)
                t2 = time.perf_counter()
                if repeat:
                    times[name, "logprob"].append(t1 - t0)
                    times[name, "update"].append(t2 - t1)
    finally:
        for group in groups.values():
            group.shutdown()
    print(f"GRPO groups: {args.sequences} sequences in groups of {args.group_size} sharing a "
          f"{args.shared_prompt}-token prompt, responses {args.min_len}-{args.max_len} tokens, {real_tokens} real "
          f"tokens ({saved} of them prompt tokens a shared forward skips), {torch.get_num_threads()} thread(s), "
          f"median of {args.repeats}")
    print(f"{'side':<16}{'logprob pass s':>16}{'update s':>10}")
    med = {key: statistics.median(value) for key, value in times.items()}
    for name in sides:
        print(f"{name:<16}{med[name, 'logprob']:>16.2f}{med[name, 'update']:>10.2f}")
    for phase in ("logprob", "update"):
        print(f"{phase}: shared prompt {med['whole rows', phase] / med['shared prompt', phase]:.2f}x faster")
    return 0


__all__ = ["add_arguments", "ragged_episodes", "run"]
