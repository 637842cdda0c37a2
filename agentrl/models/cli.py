"""`agentrl init-model`: build the offline tiny Qwen2-architecture model + tokenizer into a directory."""

from __future__ import annotations

import argparse


def add_commands(subparsers) -> None:
    from agentrl.models.tiny import SIZES

    p = subparsers.add_parser(
        "init-model",
        help="build a randomly initialised tiny Qwen2 model + byte-level BPE tokenizer offline",
        description="Write a Hugging Face model directory (weights, tokenizer, Qwen2.5-style tool chat template, "
                    "generation config) loadable with AutoModelForCausalLM / AutoTokenizer. Nothing is downloaded.",
    )
    p.add_argument("out", help="output directory (created if missing; files of an earlier build are overwritten)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="model size (default: tiny)")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default: 0)")
    p.add_argument("--init", choices=["random", "copy"], default="random",
                   help="random weights, or random plus a hand-set in-context copy (induction) circuit that lets a "
                        "tiny model learn tool use in minutes (default: random)")
    p.set_defaults(func=_init_model)


def _init_model(args: argparse.Namespace) -> int:
    from agentrl.preflight import check_output_path

    check_output_path(args.out, "init-model OUT", directory=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.tiny import CONTROL_TOKENS, SPECIAL_TOKENS, build_tiny_model, count_parameters

    out = build_tiny_model(args.out, size=args.size, seed=args.seed, init=args.init)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    config = model.config
    print(f"wrote {args.size} model (seed {args.seed}, init {args.init}) to {out}")
    for path in sorted(out.iterdir()):
        if path.is_file():
            print(f"  {path.name:<24} {path.stat().st_size:>10,} bytes")
    print(f"parameters: {count_parameters(model):,} (hidden {config.hidden_size}, layers {config.num_hidden_layers}, "
          f"heads {config.num_attention_heads}/{config.num_key_value_heads} kv, vocab {config.vocab_size}, "
          f"context {config.max_position_embeddings})")
    ids = ", ".join(f"{t}={tokenizer.convert_tokens_to_ids(t)}" for t in SPECIAL_TOKENS + CONTROL_TOKENS)
    print(f"tokens: {ids}")
    return 0
