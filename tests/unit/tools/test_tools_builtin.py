"""Built-in calculator and lookup tools, in process."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.tools.builtin.calculator import calculator, evaluate
from agentrl.tools.builtin.lookup import KnowledgeBase, lookup, lookup_session


@pytest.mark.parametrize("expression, expected", [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("2^10", "1024"), ("2 ** -1", "0.5"), ("7 // 2", "3"),
    ("7 % 4", "3"), ("-3 + +5", "2"), ("sqrt(16) + abs(-2)", "6"), ("10 / 4", "2.5"), ("1 / 3", "0.333333333333"),
    ("max(3, 9, 4) - min(2, 8)", "7"), ("round(2.567, 2)", "2.57"), ("factorial(10)", "3628800"),
    ("12345678901234567890 * 10", "123456789012345678900"), ("3 × 4 ÷ 2", "6"),
])
def test_calculator_arithmetic(expression, expected):
    assert calculator(expression) == json.dumps({"value": expected})  # exact decimal text in JSON


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('echo hi')", "unsupported syntax"),
    ("__import__('os')", "unknown function"),
    ("().__class__", "unsupported syntax"),
    ("open('/etc/passwd')", "unknown function"),
    ("x + 1", "unknown name"),
    ("9 ** 9 ** 9", "exponent"),
    ("10 ** 999 * 10 ** 999", "digits"),
    ("1 / 0", "division by zero"),
    ("sqrt(-1)", "sqrt"),
    ("1 +", "cannot parse"),
    ("[1, 2]", "unsupported syntax"),
    ("lambda: 1", "unsupported syntax"),
])
def test_calculator_rejects_unsafe_or_invalid_input_as_tool_error(expression, message):
    result = asyncio.run(calculator.invoke({"expression": expression}))
    assert result.error_kind == "tool_error" and message in result.content


def test_calculator_pi():
    assert abs(evaluate("2 * pi") - 6.283185307179586) < 1e-12


@pytest.fixture
def kb_path(tmp_path):
    rows = [{"entity": "Marie Curie", "facts": {"born in": "Warsaw", "awards": ["Nobel Prize in Physics"]}},
            {"entity": "Warsaw", "facts": {"country": "Poland"}},
            {"entity": "Warsaw", "facts": {"population": 1860000}}]
    path = tmp_path / "kb.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_lookup_finds_facts_case_and_punctuation_insensitively(kb_path):
    kb = asyncio.run(lookup_session(str(kb_path)))
    text = lookup("marie  CURIE!", session=kb)
    assert json.loads(text) == {"entity": "Marie Curie", "born in": "Warsaw", "awards": ["Nobel Prize in Physics"]}
    assert lookup("Warsaw", session=kb) == '{"entity": "Warsaw", "country": "Poland", "population": 1860000}'


def test_lookup_unknown_entity_suggests_close_names(kb_path):
    kb = asyncio.run(lookup_session(str(kb_path)))
    result = asyncio.run(lookup.invoke({"entity": "Marie Curi"}, kb))
    assert result.error_kind == "tool_error" and "Did you mean: Marie Curie?" in result.content


def test_lookup_kb_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"entity": "A", "facts": {}}\n{"name": "B"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        KnowledgeBase.load(bad)
    with pytest.raises(FileNotFoundError, match="kb_path"):
        KnowledgeBase.load(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="needs a knowledge base"):
        asyncio.run(lookup_session(None))
