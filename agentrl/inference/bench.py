"""LocalEngine throughput vs one-by-one and static-batch `model.generate` (CPU), plus a 256-request memory check.

32 concurrent greedy requests with ragged prompts (16-256 tokens) and ragged outputs (16-128 tokens, ended by
per-request max_new_tokens: a randomly initialised model rarely emits EOS) go through (1) LocalEngine, (2) the
same requests one by one with `model.generate`, (3) one left-padded static `model.generate` batch that runs until
its longest request is done. All three run in the same process, one after another, and report generated
(useful) tokens per second; the ratios are what to compare (these machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import tempfile
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="tiny,small", help="tiny model sizes to build and measure")
    parser.add_argument("--model", default=None, help="measure this HF model dir instead of building tiny ones")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", default="16,256", help="min,max prompt tokens")
    parser.add_argument("--output-len", default="16,128", help="min,max output tokens")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--memory-requests", type=int, default=256,
                        help="queued requests for the memory check on the last model (0: skip)")
    parser.add_argument("--episodes", type=int, default=32,
                        help="multi-turn check on the last model: GRPO-like episodes x 4 turns without KV reuse, "
                             "with session reuse, and with session + shared-prefix reuse (0: skip)")
    parser.add_argument("--group", type=int, default=8, help="multi-turn check: samples per task (GRPO n)")
    parser.add_argument("--seed", type=int, default=0)


def _workload(n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(rng.randint(*prompt_len))] for _ in range(n)]
    outputs = [rng.randint(*output_len) for _ in range(n)]
    return prompts, outputs


def _useful(ids: list[int], target: int, eos: set[int]) -> int:
    """Tokens a request really needed: up to its target length or its first EOS (inclusive)."""
    for i, t in enumerate(ids[:target]):
        if t in eos:
            return i + 1
    return min(len(ids), target)


def _run_engine(engine, prompts, outputs):
    from agentrl.types import SamplingParams

    async def go():
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=n, temperature=0))
                                      for p, n in zip(prompts, outputs)])

    t0, c0 = time.perf_counter(), time.process_time()
    gens = asyncio.run(go())
    return gens, time.perf_counter() - t0, time.process_time() - c0


def _run_one_by_one(model, prompts, outputs, eos, pad):
    import torch

    outs = []
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for p, n in zip(prompts, outputs):
            o = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=n, do_sample=False, eos_token_id=sorted(eos), pad_token_id=pad)
            outs.append(o[0, len(p):].tolist())
    return outs, time.perf_counter() - t0, time.process_time() - c0


def _run_static(model, prompts, outputs, eos, pad):
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        o = model.generate(ids, attention_mask=mask, max_new_tokens=max(outputs), do_sample=False,
                           eos_token_id=sorted(eos), pad_token_id=pad)
    return [row[width:].tolist() for row in o], time.perf_counter() - t0, time.process_time() - c0


def _measure(path: Path, label: str, args) -> None:
    import torch

    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(path, EngineConfig(max_batch_size=args.max_batch_size,
                                                            num_threads=args.threads))
    model, eos = engine.model, set(engine.eos_token_ids)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
    n_params = sum(p.numel() for p in model.parameters())
    prompts, outputs = _workload(args.requests, _pair(args.prompt_len), _pair(args.output_len),
                                 engine.vocab_size, args.seed)
    # Warm up every path at the size it is measured at (lazy imports, first-touch allocations of the KV buffers
    # and the largest prefill activations), so no path pays them inside its timed run: with a tiny warm-up the
    # path timed first paid them alone.
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    _run_engine(engine, prompts, outputs)
    _run_one_by_one(model, [prompts[longest]], [outputs[longest]], eos, pad)
    _run_static(model, prompts, [4] * len(prompts), eos, pad)

    gens, t_engine, c_engine = _run_engine(engine, prompts, outputs)
    seq, t_seq, c_seq = _run_one_by_one(model, prompts, outputs, eos, pad)
    static, t_static, c_static = _run_static(model, prompts, outputs, eos, pad)
    tok_engine = sum(len(g.token_ids) for g in gens)
    tok_seq = sum(len(s) for s in seq)
    tok_static = sum(_useful(s, n, eos) for s, n in zip(static, outputs))
    same = sum(g.token_ids == s for g, s in zip(gens, seq))
    r_engine, r_seq, r_static = tok_engine / t_engine, tok_seq / t_seq, tok_static / t_static
    q_engine, q_seq, q_static = tok_engine / c_engine, tok_seq / c_seq, tok_static / c_static
    print(f"\n== {label}: {n_params / 1e6:.1f}M params, {args.requests} requests, prompts {args.prompt_len}, "
          f"outputs {args.output_len}, torch threads {torch.get_num_threads()}")
    print("  (tok/s: wall clock; tok/cpu-s: per second of this process's CPU time, which other jobs on a shared "
          "machine do not distort)")
    for name, tok, t, c in (("LocalEngine (continuous batching)", tok_engine, t_engine, c_engine),
                            ("one-by-one model.generate", tok_seq, t_seq, c_seq),
                            ("static padded model.generate", tok_static, t_static, c_static)):
        print(f"  {name:34s} {tok:6d} tok in {t:6.2f}s = {tok / t:8.1f} tok/s, {tok / c:8.1f} tok/cpu-s")
    print(f"  (static batch: useful tokens only; the padded batch ran to {max(outputs)} tokens)")
    print(f"  ratio engine/one-by-one = {r_engine / r_seq:5.2f}x wall, {q_engine / q_seq:5.2f}x cpu; "
          f"engine/static = {r_engine / r_static:5.2f}x wall, {q_engine / q_static:5.2f}x cpu")
    print(f"  greedy outputs identical to one-by-one: {same}/{args.requests}; peak decode rows "
          f"{engine.stats['max_rows']}, peak KV token slots {engine.stats['max_token_slots']}")
    engine.close_sync()


def _memory_check(path: Path, args) -> None:
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    max_len = 512
    engine = LocalEngine.from_pretrained(path, EngineConfig(max_batch_size=args.max_batch_size,
                                                            max_model_len=max_len, num_threads=args.threads))
    cfg = engine.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    bytes_per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
    bound = args.max_batch_size * max_len * bytes_per_slot
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    prompts, outputs = _workload(args.memory_requests, _pair(args.prompt_len), (16, 16), engine.vocab_size,
                                 args.seed + 1)
    gens, dt, _ = _run_engine(engine, prompts, outputs)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_kv = engine.stats["max_token_slots"] * bytes_per_slot / 2**20
    print(f"\n== memory: {len(gens)} requests queued at once, max_batch_size={args.max_batch_size}, "
          f"max_model_len={max_len}: done in {dt:.1f}s; peak decode rows {engine.stats['max_rows']}; "
          f"peak KV {peak_kv:.1f} MiB (bound {bound / 2**20:.1f} MiB); process peak RSS {rss0:.0f} -> {rss1:.0f} MiB")
    engine.close_sync()


def _multi_turn(path: Path, args) -> None:
    """GRPO-like episodes of 4 turns, all concurrent: groups of `--group` samples of one task, every task's
    prompt = a 160-token system prompt shared by all + a 40-token question; each turn samples up to 32 tokens
    (T=1, per-episode seeds) and appends a 24-token observation. Three engines, one after another: no KV cache
    (identical prompts admitted together are still prefilled once), the session cache only (each turn prefills
    only its new tokens), session + shared-prefix caches (the default)."""
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine
    from agentrl.types import SamplingParams

    variants = (("no caches", 0, 0), ("session cache", 32768, 0), ("session + shared-prefix", 32768, 16384))
    results, walls = {}, {}
    for label, session_tokens, shared_tokens in variants:
        engine = LocalEngine.from_pretrained(path, EngineConfig(
            max_batch_size=args.max_batch_size, num_threads=args.threads, prefix_cache_tokens=session_tokens,
            shared_prefix_cache_tokens=shared_tokens))
        vocab = engine.vocab_size

        async def episode(i: int, run: int, engine=engine, vocab=vocab) -> list[int]:
            rng = random.Random(args.seed + 2 + run)  # the warm-up run (0) shares no prompt with the measured one
            system = [rng.randrange(10, vocab) for _ in range(160)]
            rng.seed(f"{args.seed}/{run}/{i // args.group}")
            ids = system + [rng.randrange(10, vocab) for _ in range(40)]
            for turn in range(4):
                sp = SamplingParams(max_new_tokens=32, temperature=1.0, seed=1000 * i + turn)
                g = await engine.generate(ids, sp, session_id=f"run{run}-ep{i}")
                ids = ids + g.token_ids + [(i * 7 + turn * 13 + k) % vocab for k in range(24)]
            return ids

        async def all_episodes(run: int, episode=episode):
            return await asyncio.gather(*[episode(i, run) for i in range(args.episodes)])

        asyncio.run(all_episodes(0))  # warm-up: first-touch allocations, lazy imports
        before = dict(engine.stats)
        t0, c0 = time.perf_counter(), time.process_time()
        results[label] = asyncio.run(all_episodes(1))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls[label] = wall
        prefilled = engine.stats["prefill_tokens"] - before["prefill_tokens"]
        reused = engine.stats["cached_tokens"] - before["cached_tokens"]
        print(f"  {label:27s} {wall:6.2f}s wall, {cpu:6.2f} cpu-s, prefilled {prefilled:6d} tokens, "
              f"reused {reused:6d}; speed-up vs no caches {walls['no caches'] / wall:4.2f}x")
        engine.close_sync()
    base = results["no caches"]
    for label, _, _ in variants[1:]:
        same = sum(a == b for a, b in zip(base, results[label]))
        print(f"  identical episodes, {label} vs no caches: {same}/{args.episodes}")


def _pair(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    return lo, hi


def run(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        targets = [(Path(args.model), Path(args.model).name)]
        tmp = None
    else:
        from agentrl.models.tiny import build_tiny_model

        tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-engine-")
        targets = [(build_tiny_model(Path(tmp.name) / size, size=size, seed=args.seed), f"{size} model")
                   for size in args.sizes.split(",")]
    try:
        for path, label in targets:
            _measure(path, label, args)
        if args.episodes:
            print(f"\n== multi-turn: {args.episodes} concurrent episodes x 4 turns, groups of {args.group}, on "
                  f"{targets[-1][1]}")
            _multi_turn(targets[-1][0], args)
        if args.memory_requests:
            _memory_check(targets[-1][0], args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0
