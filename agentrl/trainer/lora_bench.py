"""LoRA vs full fine-tuning of the policy: optimizer and gradient memory, peak RSS and update time, side by side.

    agentrl bench lora                                   # the offline small model (6.7M parameters), rank 16
    agentrl bench lora --size base --rank 16 --repeats 3
    agentrl bench lora --model runs/tiny-model --target-modules q_proj,v_proj

Both sides are one in-process FSDP2 rank (gloo) with the same model, batch (ragged sequences), AdamW and PPO loss;
the LoRA side has `actor.lora` (rank, alpha 2 x rank, the seven projections unless --target-modules). Memory is
what the rank allocated, read from the tensors themselves (`FSDPWorker.memory_bytes`): the .grad tensors of the
last optimizer step and the optimizer state (AdamW's two moments per trained parameter), so the ratio is exactly
the trained-parameter ratio. Peak RSS is each side's own process (spawned: the model loaded and
`--repeats` + 1 updates), which also holds Python, torch and the frozen weights. The update time is the median of
`--repeats` updates per side after one warm-up, the sides alternating so a change in machine load hits both.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

SIDES = ("full", "lora")
MB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="an HF model dir (default: build the offline model --size)")
    parser.add_argument("--size", default="small", help="size of the built model (agentrl.models.tiny.SIZES)")
    parser.add_argument("--rank", type=int, default=16, help="actor.lora.rank (alpha is twice the rank)")
    parser.add_argument("--target-modules", default="all-linear",
                        help="actor.lora.target_modules, comma-separated (default all-linear: the seven projections)")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per side (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side's rank")
    parser.add_argument("--no-rss", action="store_true", help="skip the two processes that measure peak RSS")
    parser.add_argument("--seed", type=int, default=0)


def _actor(args: argparse.Namespace, side: str):
    from agentrl.trainer.config import ActorConfig, LoraConfig

    modules = "all-linear" if args.target_modules == "all-linear" else args.target_modules.split(",")
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank, target_modules=modules) if side == "lora" else None
    return ActorConfig(lr=1e-5, grad_clip=1e6, max_tokens_per_micro_batch=4 * args.max_len,
                       num_threads_per_worker=args.threads, lora=lora)


def _batch(args: argparse.Namespace, model_path: str):
    from transformers import AutoConfig

    from agentrl.trainer.batch import episodes_to_batch
    from agentrl.trainer.bench import ragged_episodes

    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    eps = ragged_episodes(args.sequences, args.min_len, args.max_len, vocab, args.seed)
    rng = random.Random(args.seed + 1)
    return episodes_to_batch(eps, pad_token_id=0, advantages=[rng.choice([-1.0, 1.0]) for _ in eps])


def _update(group, batch) -> float:
    t0 = time.perf_counter()
    group.update_policy(batch, temperature=1.0, mini_batch_size=batch.batch_size[0], shuffle=False)
    return time.perf_counter() - t0


def _peak_rss_mb(args: argparse.Namespace, model_path: str, side: str) -> float:
    """Run in a fresh process: one side's model loaded and updated `repeats` + 1 times; its peak RSS in MiB."""
    import resource

    from agentrl.trainer.config import ModelConfig
    from agentrl.trainer.worker import WorkerGroup

    batch = _batch(args, model_path)
    group = WorkerGroup(ModelConfig(path=model_path), _actor(args, side), total_steps=100, use_ray=False)
    try:
        batch["old_logprobs"], _ = group.compute_logprobs(batch, temperature=1.0)
        for _ in range(args.repeats + 1):
            _update(group, batch)
    finally:
        group.shutdown()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run(args: argparse.Namespace) -> int:
    import multiprocessing

    from agentrl.trainer.config import ModelConfig
    from agentrl.trainer.worker import WorkerGroup

    tmp = None
    model_path = args.model
    if model_path is None:
        from agentrl.models.tiny import build_tiny_model

        tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-lora-")
        model_path = str(build_tiny_model(tmp.name, size=args.size))
    try:
        batch = _batch(args, model_path)
        groups = {side: WorkerGroup(ModelConfig(path=model_path), _actor(args, side), total_steps=100,
                                    use_ray=False) for side in SIDES}
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        try:
            batch["old_logprobs"], _ = groups["full"].compute_logprobs(batch, temperature=1.0)
            for repeat in range(args.repeats + 1):  # round 0 warms up; the order alternates
                for side in SIDES if repeat % 2 == 0 else reversed(SIDES):
                    seconds = _update(groups[side], batch)
                    if repeat:
                        times[side].append(seconds)
            memory = {side: group.memory_bytes() for side, group in groups.items()}
        finally:
            for group in groups.values():
                group.shutdown()
        rss = {}
        if not args.no_rss:
            with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
                rss = {side: pool.apply(_peak_rss_mb, (args, model_path, side)) for side in SIDES}
    finally:
        if tmp is not None:
            tmp.cleanup()
    _report(args, model_path if args.model else f"the {args.size} model", batch, memory, times, rss)
    return 0


def _report(args: argparse.Namespace, model: str, batch, memory: dict, times: dict, rss: dict) -> None:
    seconds = {side: statistics.median(times[side]) for side in SIDES}
    full_params = memory["full"]["parameters"] // 4  # fp32
    print(f"LoRA vs full fine-tuning: {model} ({full_params / 1e6:.2f}M parameters, fp32), rank {args.rank}, "
          f"alpha {2 * args.rank}, target modules {args.target_modules}; {args.sequences} sequences of "
          f"{args.min_len}-{args.max_len} tokens ({int(batch['seq_lens'].sum())} tokens), AdamW, one update = one "
          f"optimizer step, median of {args.repeats}, {args.threads} thread(s)")
    header = f"{'side':<6}{'trained params':>16}{'grads MiB':>11}{'optimizer MiB':>15}{'grads+opt MiB':>15}"
    print(header + (f"{'peak RSS MiB':>14}" if rss else "") + f"{'update s':>10}")
    for side in SIDES:
        m = memory[side]
        line = (f"{side:<6}{m['trained_parameters'] // 4:>16,}{m['grads'] / MB:>11.2f}{m['optimizer'] / MB:>15.2f}"
                f"{(m['grads'] + m['optimizer']) / MB:>15.2f}")
        print(line + (f"{rss[side]:>14.0f}" if rss else "") + f"{seconds[side]:>10.3f}")
    lora, full = memory["lora"], memory["full"]
    ratio = (lora["grads"] + lora["optimizer"]) / (full["grads"] + full["optimizer"])
    print(f"lora / full: trained parameters {lora['trained_parameters'] / full['trained_parameters']:.1%}, grads + "
          f"optimizer state {ratio:.1%} ({'within' if ratio <= 0.10 else 'above'} the 10% target), update time "
          f"{seconds['lora'] / seconds['full']:.2f}x" + (f", peak RSS {rss['lora'] - rss['full']:+.0f} MiB" if rss
                                                          else ""))


__all__ = ["add_arguments", "run"]
