"""One GRPO step, phase by phase, on a given model / task / batch; `--vs-trl` runs TRL's GRPOTrainer on the same
model, prompts and batch in the same run and prints both s/step and the ratio.

    agentrl bench step                      # the setup below: random 4-layer Qwen2, real Qwen2 tokenizer
    agentrl bench step --vs-trl             # + TRL GRPOTrainer(tools=[multiply]) side by side (pip install trl)
    agentrl bench step --baseline           # + agentrl with this release's step speed-ups off, same run
    agentrl bench step --model runs/tiny-model --tokenizer runs/tiny-model

The setup (defaults): a random Qwen2 (4 layers, hidden 128, intermediate 512, 2 heads / 1 KV head, tied
embeddings, ~20M parameters, almost all in the 151k-token embedding), saved with the Qwen2 tokenizer and Qwen2.5
tool template shipped in `agentrl/models/qwen2_tokenizer`; task "What is {a}*{b}? Use the multiply
tool." with 3-digit a, b and a `multiply(a, b)` tool; exact-answer reward; 1 prompt x 8 episodes per step; at
most 48 new tokens per turn and up to 2 tool calls; lr 1e-5; loss-side KL coefficient 0.001 (so a reference
model is used); one optimizer step per step; fp32 everywhere.

Each side runs `--warmup` untimed steps and then `--steps` timed ones; the sides alternate `--rounds` times so a
change in machine load hits all of them. agentrl's phases come from its own metrics.jsonl (`timing/*`); TRL's
s/step from a trainer callback around each optimizer step (its generation, reference and update included), in
`agentrl.trainer.bench_trl`, run as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from agentrl.tools.base import tool

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.jinja")
PROMPT = "What is {a}*{b}? Use the multiply tool."
PHASES = ("rollout_s", "old_logprob_s", "ref_logprob_s", "update_s", "sync_s", "step_s")


@tool
def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return str(int(a) * int(b))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="HF model dir (default: build the random 4-layer Qwen2 of the bench's setup)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer dir for the built model (default: the Qwen2 tokenizer agentrl ships)")
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps per side and round (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="alternations of the sides (default 1)")
    parser.add_argument("--n", type=int, default=8, help="episodes per prompt (default 8)")
    parser.add_argument("--prompts", type=int, default=1, help="prompts per step (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per turn (default 48)")
    parser.add_argument("--vs-trl", action="store_true", help="also run TRL's GRPOTrainer (needs `pip install trl`)")
    parser.add_argument("--baseline", action="store_true",
                        help="also run agentrl with the step speed-ups off (actor.fast_logprobs=false, "
                             "actor.reuse_old_logprobs=false, actor.share_prompt_prefix=false, "
                             "actor.num_threads_per_worker=1)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="train-config overrides for the agentrl sides, e.g. actor.num_threads_per_worker=2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default=None, help="keep the run directories under this path")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one side's run may take (default 3600)")


def default_tokenizer_dir() -> Path:
    """The Qwen2 tokenizer shipped as package data of agentrl.models (installed packages included)."""
    return Path(str(resources.files("agentrl.models").joinpath("qwen2_tokenizer")))


def build_model(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """The random 4-layer Qwen2 of the setup, with the given tokenizer's files and chat template."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         max_position_embeddings=4096, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def write_tasks(path: Path, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        rows.append({"prompt": [{"role": "user", "content": PROMPT.format(a=a, b=b)}], "tools": ["multiply"],
                     "reward": {"type": "exact_match", "ground_truth": str(a * b)}, "data_source": "multiply",
                     "task_id": f"multiply-{i}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def agentrl_config(model: Path, tasks: Path, run_dir: Path, args, *, fast: bool):
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig

    data = {
        "model": {"path": str(model), "dtype": "float32", "gradient_checkpointing": False},
        "data": {"train_files": [str(tasks)], "train_batch_size": args.prompts, "shuffle": False},
        "engine": {"backend": "local", "dtype": "float32", "max_batch_size": 64, "num_threads": None},
        "tools": {"functions": ["agentrl.trainer.step_bench:multiply"]},
        "agent": {"max_assistant_turns": 3, "max_new_tokens_per_turn": args.max_new_tokens,
                  "max_response_tokens": 3 * args.max_new_tokens + 128, "max_tool_response_tokens": 32},
        "rollout": {"n": args.n, "temperature": 1.0, "seed": args.seed},
        "reward": {"answer_from": "final_text"},
        "actor": {"lr": 1e-5, "weight_decay": 0.0, "warmup_steps": 0, "lr_schedule": "constant", "grad_clip": 1.0,
                  "ppo_mini_batch_size": args.prompts, "ppo_epochs": 1, "use_kl_loss": True,
                  "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "entropy_coeff": 0.0,
                  "max_tokens_per_micro_batch": 16384, "world_size": 1},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"total_steps": args.warmup + args.steps, "run_dir": str(run_dir), "test_freq": 0,
                    "save_freq": 0, "resume": "never", "seed": args.seed, "loggers": ["jsonl"],
                    "save_hf_model": False},
    }
    overrides = list(args.set)
    if not fast:
        overrides += ["actor.fast_logprobs=false", "actor.reuse_old_logprobs=false", "actor.share_prompt_prefix=false",
                      "actor.num_threads_per_worker=1"]
    return load_config(TrainConfig, data=data, overrides=overrides)


def run_agentrl(model: Path, tasks: Path, run_dir: Path, args, *, fast: bool) -> list[dict]:
    """Timed steps' metrics, from a fresh `agentrl train` run in a subprocess (its own Ray, its own threads)."""
    from agentrl.config import save_config

    spec = save_config(agentrl_config(model, tasks, run_dir, args, fast=fast), run_dir.parent, f"{run_dir.name}.yaml")
    try:
        proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", str(spec)], capture_output=True,
                              text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"agentrl train did not finish within {args.timeout} s (--timeout):\n"
                           f"{(e.stdout or '')[-3000:]}\n{(e.stderr or '')[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing/step_s" in r]
    return rows[args.warmup:]


def run_trl(model: Path, tasks: Path, out: Path, args) -> dict:
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit("--vs-trl needs TRL: `.venv/bin/pip install trl` (an optional extra: pip install "
                         "'agentrl[trl]')") from None
    cmd = [sys.executable, "-m", "agentrl.trainer.bench_trl", str(model), str(tasks), str(out),
           str(args.warmup + args.steps), str(args.n), str(args.prompts), str(args.max_new_tokens), str(args.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TRL_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"TRL run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(line[len("TRL_RESULT "):])
    result["times"] = result["times"][args.warmup:]
    return result


def _median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else 0.0


def run(args: argparse.Namespace) -> int:
    keep = Path(args.keep) if args.keep else None
    root = keep or Path(tempfile.mkdtemp(prefix="agentrl-bench-step-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        if args.model:
            model = Path(args.model)
        else:
            tok_dir = Path(args.tokenizer) if args.tokenizer else default_tokenizer_dir()
            if not (tok_dir / "vocab.json").is_file():
                raise SystemExit(f"no tokenizer at {tok_dir}: pass --tokenizer DIR (an HF tokenizer dir) or --model")
            model = build_model(root / "model", tok_dir, seed=args.seed)
        tasks = root / "tasks.jsonl"
        write_tasks(tasks, 256, args.seed)
        sides = ["agentrl"] + (["baseline"] if args.baseline else []) + (["trl"] if args.vs_trl else [])
        results: dict[str, list] = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in sides:
                out = root / f"{side}-r{r}"
                shutil.rmtree(out, ignore_errors=True)
                if side == "trl":
                    res = run_trl(model, tasks, out, args)
                    results[side] += [{"timing/step_s": t} for t in res["times"]]
                    print(f"round {r}: trl {statistics.median(res['times']):.2f} s/step "
                          f"({res['threads']} torch threads)", flush=True)
                else:
                    rows = run_agentrl(model, tasks, out, args, fast=side == "agentrl")
                    results[side] += rows
                    print(f"round {r}: {side} {_median(rows, 'timing/step_s'):.2f} s/step", flush=True)
        print(f"\nGRPO step, {args.prompts} prompt(s) x {args.n} episodes, <= {args.max_new_tokens} new tokens per "
              f"turn, median of {args.steps * args.rounds} steps per side (after {args.warmup} warm-up):")
        header = f"{'phase (s)':<16}" + "".join(f"{s:>12}" for s in sides if s != "trl")
        print(header)
        for phase in PHASES:
            print(f"{phase:<16}" + "".join(f"{_median(results[s], 'timing/' + phase):>12.3f}"
                                           for s in sides if s != "trl"))
        print(f"{'tokens/step':<16}" + "".join(f"{_median(results[s], 'perf/batch_tokens'):>12.0f}"
                                               for s in sides if s != "trl"))
        ours = _median(results["agentrl"], "timing/step_s")
        if "baseline" in results:
            base = _median(results["baseline"], "timing/step_s")
            print(f"\nagentrl {ours:.2f} s/step vs speed-ups off {base:.2f} s/step: {base / ours:.2f}x faster")
        if "trl" in results:
            theirs = _median(results["trl"], "timing/step_s")
            print(f"agentrl {ours:.2f} s/step vs TRL GRPOTrainer {theirs:.2f} s/step: {theirs / ours:.2f}x faster")
        return 0
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
