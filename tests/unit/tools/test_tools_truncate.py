"""truncate_text: characters or tokens, head/tail/middle, visible marker, budget respected."""

from __future__ import annotations

import pytest

from agentrl.tools import truncate_text

TEXT = "".join(f"line {i}\n" for i in range(400))


@pytest.mark.parametrize("side", ["head", "tail", "middle"])
def test_chars_budget_and_marker(side):
    out, cut = truncate_text(TEXT, max_chars=120, side=side)
    assert cut and len(out) == 120 and "chars truncated]" in out
    if side in ("head", "middle"):
        assert out.startswith("line 0\nline 1\n")
    if side in ("tail", "middle"):
        assert out.endswith("line 399\n")
    if side == "head":
        assert "line 399" not in out
    if side == "tail":
        assert "line 0\n" not in out


def test_marker_counts_what_was_removed():
    out, _ = truncate_text("a" * 1000, max_chars=100, side="head")
    removed = int(out.split("...[")[1].split(" ")[0])
    assert removed == 1000 - len(out.split("\n")[0])


def test_short_text_untouched():
    assert truncate_text("hello", max_chars=10) == ("hello", False)
    assert truncate_text("", max_chars=1) == ("", False)


def test_tiny_budget_is_a_hard_cut():
    assert truncate_text("abcdefghij", max_chars=4, side="head") == ("abcd", True)
    assert truncate_text("abcdefghij", max_chars=4, side="tail") == ("ghij", True)


@pytest.fixture(scope="module")
def tok(qwen2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_tokenizer_dir)


@pytest.mark.parametrize("side", ["head", "tail", "middle"])
def test_tokens_with_a_real_tokenizer(tok, side):
    out, cut = truncate_text(TEXT, max_tokens=60, tokenizer=tok, side=side)
    n = len(tok.encode(out, add_special_tokens=False))
    assert cut and "tokens truncated]" in out
    assert 50 <= n <= 61, n  # the budget holds up to a boundary token
    short, cut_short = truncate_text("just a few words", max_tokens=60, tokenizer=tok)
    assert (short, cut_short) == ("just a few words", False)


def test_chars_then_tokens_and_argument_errors(tok):
    out, cut = truncate_text(TEXT, max_chars=2000, max_tokens=30, tokenizer=tok)
    assert cut and len(tok.encode(out, add_special_tokens=False)) <= 31
    with pytest.raises(ValueError, match="needs a tokenizer"):
        truncate_text(TEXT, max_tokens=10)
    with pytest.raises(ValueError, match="side"):
        truncate_text(TEXT, max_chars=10, side="left")
