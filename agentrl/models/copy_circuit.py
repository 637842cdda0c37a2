"""A hand-set induction (copy) circuit for the tiny models: the in-context copying a pretrained LM arrives with.

Tool use is copying: the arguments of a call are copied from the question (`4821 + 397`, `Kalo Works`) and the
answer is copied from the tool's response. Pretrained LMs do this with *induction heads*: a previous-token head
writes "which token came before me" into each position, and a later head matches the current token against it,
attending to the token that followed the earlier occurrence and copying it. A randomly initialised model has to
discover that two-layer circuit by gradient descent, which takes far longer than the CPU quickstart's budget
(docs/benchmarks.md, "Copy circuit"). So `build_tiny_model(init="copy")` sets the circuit's weights
directly, in a normal Qwen2 model (no new modules; every weight stays trainable, and SFT/RL adapt it freely):

- embeddings (tied with the LM head) live in the first `c = head_dim` residual dims, random with std `sigma`;
- layer 0: head 0 attends to the previous token, head 1 (when the model has room) to the token two back. Both are
  positional (q/k biases whose RoPE rotations peak at offsets 1 and 2, zero q/k weights) and write the attended
  token's embedding into their own residual dims [c, 2c) and [2c, 3c);
- layer 1: head 0 is the induction head. Its query is the current token (and the previous one), its key the
  previous token (and the one before) of each earlier position, placed in RoPE's low-frequency dims so the match
  survives distance; its value/output copy the attended token's embedding back into dims [0, c), where the tied
  LM head reads it as "predict this token";
- every other residual-branch output (MLP down projections, other layers' attention outputs) starts at zero
  ("zero-init residual branches"), so the copy signal reaches the LM head clean; their input weights stay random,
  so training can switch them on.

The match is on two tokens (bigrams) because single-token matching is ambiguous inside digit runs like `7006`;
how well the untrained circuit copies is in docs/benchmarks.md.
"""

from __future__ import annotations

import math

import torch

# Residual-stream layout, in units of c = head_dim: [0,c) token, [c,2c) previous token, [2c,3c) two back.
PREV_TOKEN_AMPLITUDE = 8.0  # q/k bias size of the positional heads: attention ~0.999 on the intended offset
PREV_TOKEN_PAIRS = 8  # rotary frequency pairs the positional heads use (the fastest-rotating ones)
MATCH_SCALE = 2.0  # induction head q/k weight scale: match logits ~10 above non-matches
COPY_SCALE = 0.4  # induction head output scale: the copied token outweighs the current one ~4:1 in the logits
EMBED_STD = 0.1


def _offset_query_bias(theta: torch.Tensor, head_dim: int, offset: int) -> torch.Tensor:
    """q bias that, against the key bias `_positional_key_bias`, peaks at `offset` tokens back (HF rotate_half)."""
    half = head_dim // 2
    bias = torch.zeros(head_dim)
    for i in range(PREV_TOKEN_PAIRS):
        bias[i] = PREV_TOKEN_AMPLITUDE * torch.cos(offset * theta[i])
        bias[i + half] = -PREV_TOKEN_AMPLITUDE * torch.sin(offset * theta[i])
    return bias


def _positional_key_bias(head_dim: int) -> torch.Tensor:
    bias = torch.zeros(head_dim)
    bias[:PREV_TOKEN_PAIRS] = PREV_TOKEN_AMPLITUDE
    return bias


def _orthonormal_rows(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(cols, rows, generator=generator))[0].T


@torch.no_grad()
def install_copy_circuit(model, seed: int = 0) -> dict:
    """Overwrite `model`'s (a Qwen2ForCausalLM with tied embeddings, >= 2 layers) initial weights in place with
    the induction circuit described in the module docstring. Returns what was installed (for logging)."""
    cfg = model.config
    d, heads, kv_heads = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = d // heads
    c, half = hd, hd // 2
    if cfg.num_hidden_layers < 2 or not cfg.tie_word_embeddings or d < 2 * c:
        raise ValueError("the copy circuit needs >= 2 layers, tied embeddings and hidden_size >= 2 * head_dim; "
                         f"got {cfg.num_hidden_layers} layers, tie_word_embeddings={cfg.tie_word_embeddings}, "
                         f"hidden {d}, head_dim {hd}")
    bigram = d >= 3 * c and heads // kv_heads >= 2  # layer 0 heads 0 and 1 share kv head 0
    gen = torch.Generator().manual_seed(seed)
    theta = cfg.rope_parameters["rope_theta"] ** (-torch.arange(half, dtype=torch.float32) * 2 / hd)

    embed = model.model.embed_tokens.weight
    embed.zero_()
    embed[:, :c] = torch.randn(embed.shape[0], c, generator=gen) * EMBED_STD

    for layer in model.model.layers:  # zero-init residual branches; inputs stay random
        layer.mlp.down_proj.weight.zero_()
        layer.self_attn.o_proj.weight.zero_()

    # Layer 0: positional heads copying the previous (and second previous) token into their own dims.
    first = model.model.layers[0].self_attn
    first.q_proj.weight.zero_()
    first.q_proj.bias.zero_()
    first.q_proj.bias[:hd] = _offset_query_bias(theta, hd, 1)
    first.k_proj.weight[:hd].zero_()
    first.k_proj.bias[:hd] = _positional_key_bias(hd)
    first.v_proj.weight[:hd].zero_()
    first.v_proj.bias[:hd].zero_()
    first.v_proj.weight[:hd, :c] = torch.eye(c)
    # The RMSNorm before attention scales a token's embedding to norm sqrt(d); bring it back to the embedding's size.
    gain = EMBED_STD * math.sqrt(c) / math.sqrt(d)
    first.o_proj.weight[c:2 * c, :hd] = gain * torch.eye(c)
    if bigram:
        first.q_proj.bias[hd:2 * hd] = _offset_query_bias(theta, hd, 2)
        first.o_proj.weight[2 * c:3 * c, hd:2 * hd] = gain * torch.eye(c)

    # Layer 1 head 0: induction. q·k compares (token, previous) at the query with (previous, two back) at the key,
    # in the low-frequency rotary dims (rotation under ~0.6 rad over 60 tokens).
    second = model.model.layers[1].self_attn
    low = list(range(half // 2, half)) + list(range(half + half // 2, hd))
    for proj in (second.q_proj, second.k_proj, second.v_proj):
        proj.weight[:hd].zero_()
        proj.bias[:hd].zero_()
    if bigram:
        low_a, low_b = low[0::2], low[1::2]
        pa, pb = _orthonormal_rows(len(low_a), c, gen), _orthonormal_rows(len(low_b), c, gen)
        second.q_proj.weight[low_a, :c] = MATCH_SCALE * pa
        second.k_proj.weight[low_a, c:2 * c] = MATCH_SCALE * pa
        second.q_proj.weight[low_b, c:2 * c] = MATCH_SCALE * pb
        second.k_proj.weight[low_b, 2 * c:3 * c] = MATCH_SCALE * pb
    else:
        p = _orthonormal_rows(len(low), c, gen)
        second.q_proj.weight[low, :c] = MATCH_SCALE * p
        second.k_proj.weight[low, c:2 * c] = MATCH_SCALE * p
    second.v_proj.weight[:hd, :c] = torch.eye(c)
    second.o_proj.weight[:c, :hd] = COPY_SCALE * torch.eye(c)
    return {"copy_circuit": "bigram" if bigram else "unigram", "token_dims": c}


__all__ = ["install_copy_circuit"]
