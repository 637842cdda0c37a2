"""Tool output limits: cut long observations by tokens (with a tokenizer) or characters, with a visible marker.

`side` names the part that is kept: "head" keeps the beginning, "tail" keeps the end, "middle" keeps both ends
and removes the middle (the usual choice for logs and tracebacks, whose first and last lines matter most).
The marker says how much was removed so the model knows the observation is incomplete. With `max_tokens` the
result (marker included) re-encodes to at most `max_tokens` tokens up to tokenizer boundary effects of a token
or two; with `max_chars` it is at most `max_chars` characters.
"""

from __future__ import annotations

SIDES = ("head", "tail", "middle")


def _marker(removed: int, unit: str, side: str) -> str:
    core = f"...[{removed} {unit} truncated]..."
    return {"head": "\n" + core, "tail": core + "\n", "middle": "\n" + core + "\n"}[side]


def _cut(pieces: list, keep: int, side: str) -> tuple[list, list]:
    """Split the kept items into (head part, tail part) according to `side`."""
    if keep <= 0:
        return [], []
    if side == "head":
        return pieces[:keep], []
    if side == "tail":
        return [], pieces[-keep:]
    head = (keep + 1) // 2
    tail = keep - head
    return pieces[:head], (pieces[-tail:] if tail else [])


def _join(head: str, marker: str, tail: str, side: str) -> str:
    if side == "head":
        return head.rstrip("\ufffd") + marker
    if side == "tail":
        return marker + tail.lstrip("\ufffd")
    return head.rstrip("\ufffd") + marker + tail.lstrip("\ufffd")


def _truncate_chars(text: str, max_chars: int, side: str) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    removed = len(text) - max_chars
    # The marker's length depends on `removed`, which depends on the marker: iterate to the fixed point.
    for _ in range(3):
        marker = _marker(removed, "chars", side)
        keep = max_chars - len(marker)
        removed = len(text) - max(keep, 0)
    if keep <= 0:  # the budget cannot even hold the marker: a hard cut is the only honest option
        return (text[:max_chars] if side != "tail" else text[-max_chars:]), True
    head_n = {"head": keep, "tail": 0, "middle": (keep + 1) // 2}[side]
    tail_n = keep - head_n
    head_s = text[:head_n]
    tail_s = text[len(text) - tail_n:] if tail_n else ""
    return _join(head_s, marker, tail_s, side), True


def _truncate_tokens(text: str, max_tokens: int, tokenizer, side: str) -> tuple[str, bool]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, False
    removed = len(ids) - max_tokens
    for _ in range(3):
        marker = _marker(removed, "tokens", side)
        marker_len = len(tokenizer.encode(marker, add_special_tokens=False))
        keep = max_tokens - marker_len
        removed = len(ids) - max(keep, 0)
    if keep <= 0:
        kept = ids[:max_tokens] if side != "tail" else ids[-max_tokens:]
        return tokenizer.decode(kept), True
    head, tail = _cut(ids, keep, side)
    head_s = tokenizer.decode(head) if head else ""
    tail_s = tokenizer.decode(tail) if tail else ""
    return _join(head_s, marker, tail_s, side), True


def truncate_text(text: str, *, max_tokens: int | None = None, max_chars: int | None = None, tokenizer=None,
                  side: str = "middle") -> tuple[str, bool]:
    """Return (text, was_truncated). Characters are cut first (cheap), then tokens when `max_tokens` is set.

    `tokenizer` is any object with `encode(text, add_special_tokens=False)` and `decode(ids)` (a Hugging Face
    tokenizer); it is required with `max_tokens`.
    """
    if side not in SIDES:
        raise ValueError(f"truncate_text: side must be one of {SIDES} (the part kept), got {side!r}")
    if max_tokens is not None and tokenizer is None:
        raise ValueError("truncate_text: max_tokens needs a tokenizer (or use max_chars)")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"truncate_text: max_tokens must be >= 1, got {max_tokens}")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"truncate_text: max_chars must be >= 1, got {max_chars}")
    truncated = False
    if max_chars is not None:
        text, truncated = _truncate_chars(text, max_chars, side)
    if max_tokens is not None:
        text, cut = _truncate_tokens(text, max_tokens, tokenizer, side)
        truncated = truncated or cut
    return text, truncated


__all__ = ["SIDES", "truncate_text"]
