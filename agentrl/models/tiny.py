"""Build a tiny Qwen2-architecture causal LM and its byte-level BPE tokenizer, offline and seeded.

No weights or data can be downloaded on the machines agentrl is tested on, so tests and the CPU quickstart use a
model built here: a byte-level BPE tokenizer (Qwen2's pre-tokenizer, digits split one per token) trained on a
synthetic corpus (`agentrl.models.corpus`), ChatML special tokens, a Qwen2.5-style tool-calling chat template, and
a randomly initialised `Qwen2ForCausalLM`. The output directory is a normal Hugging Face model directory:

    from agentrl.models.tiny import build_tiny_model
    path = build_tiny_model("runs/tiny-model", size="tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path); model = AutoModelForCausalLM.from_pretrained(path)

The tokenizer does not depend on `seed` (its corpus has a fixed seed), so every size and seed shares one
vocabulary and the same token ids; `seed` only changes the initial weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from agentrl.models.corpus import generate_corpus

# Special tokens are dropped by decode(skip_special_tokens=True); the control tokens are kept (as in Qwen2.5),
# so a decoded assistant turn still shows its <tool_call> blocks.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONTROL_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2's split: contractions, letter runs, single digits, punctuation runs, newlines, spaces.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
VOCAB_SIZE = 3072  # BPE tokens (256 bytes + merges) plus the added tokens above
CORPUS_SEED = 20240601
CORPUS_CHARS = 500_000
MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


# head_dim 64 in both: the smallest head size every GPU attention kernel (FlashAttention, FlashInfer) supports,
# so the same model directory also serves from SGLang.
SIZES: dict[str, ModelShape] = {
    # ~0.8M parameters: fast enough for unit tests and CPU RL smoke runs.
    "tiny": ModelShape(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=384),
    # tiny plus a third layer (~1.0M parameters): the copy circuit fills layers 0-1 and the whole 128-dim residual,
    # the third layer starts as an identity (zero-init output) free for what SFT and RL put there; measured
    # against tiny in docs/log.md (2026-12-02, ffd05f2)
    "tiny3": ModelShape(hidden_size=128, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                        intermediate_size=384),
    # ~6.7M parameters: for CPU runs that should visibly learn.
    "small": ModelShape(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=1024),
    # ~103M parameters (412 MB in float32): for weight-sync and memory benchmarks, too slow to train on CPU.
    "base": ModelShape(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=4,
                       intermediate_size=2048),
}


INITS = ("random", "copy")


def build_tiny_model(out_dir: str | Path, size: str = "tiny", seed: int = 0, init: str = "random") -> Path:
    """Write a Qwen2 model + tokenizer + chat template + generation config to `out_dir`.

    `init="random"`: the usual random initialisation. `init="copy"`: random, then the in-context copy (induction)
    circuit of `agentrl.models.copy_circuit` set by hand, which is what lets a model this small learn tool use
    (copying arguments and results) within minutes of CPU training.
    Deterministic: the same `size`, `seed` and `init` give byte-identical weight and tokenizer files. Existing
    files of a previous build in `out_dir` are overwritten. Returns `out_dir` as a Path.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from agentrl.files import make_readable

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; choose one of {list(INITS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)

    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **asdict(SIZES[size]),
        hidden_act="silu",
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        use_sliding_window=False,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    # Seed a private generator state so building a model does not disturb the caller's RNG streams.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    if init == "copy":
        from agentrl.models.copy_circuit import install_copy_circuit

        install_copy_circuit(model, seed=seed)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)

    generation = GenerationConfig(
        bos_token_id=None,
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    generation.save_pretrained(out)
    make_readable(out)
    return out


def build_tokenizer():
    """The tiny model's tokenizer as a `PreTrainedTokenizerFast` (trained on the synthetic corpus; ~0.5 s)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template(),
    )


def train_bpe():
    """Train the byte-level BPE `tokenizers.Tokenizer`; added tokens get the last ids, as in Qwen2."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # NFC like Qwen2 (transformers loads every qwen2-type model dir with Qwen2Tokenizer, which sets it anyway):
    # decode(encode(text)) == text for NFC text, i.e. nearly all text; other text comes back NFC-normalised.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(CONTROL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(generate_corpus(CORPUS_SEED, CORPUS_CHARS), trainer=trainer)
    if tokenizer.get_vocab_size() != trainer.vocab_size:
        # Token ids must not drift between builds: fewer merges would renumber every added token.
        raise RuntimeError(
            f"BPE training produced {tokenizer.get_vocab_size()} tokens instead of {trainer.vocab_size}; the "
            f"{CORPUS_CHARS}-character corpus is too small for this tokenizers version: raise CORPUS_CHARS")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTROL_TOKENS])
    return tokenizer


def chat_template() -> str:
    """The Jinja chat template shipped with the tiny model (ChatML + Qwen2.5-style tool calls)."""
    return resources.files("agentrl.models").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def count_parameters(model) -> int:
    """Number of distinct parameters (tied input/output embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
