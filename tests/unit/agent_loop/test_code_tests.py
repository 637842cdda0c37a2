"""Pure parts of the hack-proof code rewards: the test rewrite, strict comparisons, the report check."""

from __future__ import annotations

import hmac

import pytest

from agentrl.agent_loop import sandbox_harness as h
from agentrl.agent_loop.code_tests import (
    REPORT_MARKER,
    TestSourceError,
    build_program,
    find_report,
    normalise_output,
    report_from_summary,
    rewrite_tests,
)


class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __sub__(self, other):
        return 0

    __hash__ = object.__hash__


class LyingStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def test_rewrite_routes_comparisons_arithmetic_and_asserts():
    rw = rewrite_tests("import math\nassert f(1) == 2, 'msg'\nassert 0 < f(2) <= 3\nx: int | None = f(1) - 1\n"
                       "assert f(1) is not None")
    assert rw.originals[1] == "assert f(1) == 2, 'msg'"
    assert rw.statements[0] == "math = __agentrl_import__('math')"
    assert "__agentrl_check__(__agentrl_cmp__('==', f(1), 2), 0, lambda: 'msg')" in rw.statements[1]
    assert "__agentrl_chain__(0, (('<', lambda: f(2)), ('<=', lambda: 3)))" in rw.statements[2]
    assert rw.statements[3].startswith("x: int | None = __agentrl_bin__('-', f(1), 1)")
    assert "f(1) is not None" in rw.statements[4] and "cmp" not in rw.statements[4]
    assert rw.asserts[0] == "assert f(1) == 2, 'msg'" and len(rw.asserts) == 3
    assert rw.modules == ["math"]


def test_rewrite_of_from_imports_and_broken_tests():
    rw = rewrite_tests("from fractions import Fraction as F")
    assert rw.statements == ["F = __agentrl_import__('fractions', 'Fraction')"]
    assert rw.modules == ["fractions", "fractions.Fraction"]
    with pytest.raises(TestSourceError):
        rewrite_tests("assert f(1 ==")


def test_strict_compare_defeats_always_equal_and_lying_subclasses():
    for op in ("==", "!=", "<", "in"):
        with pytest.raises(h.StrictTypeError):
            h.strict_compare(op, AlwaysEqual(), 5)
    assert h.strict_compare("==", LyingStr("nope"), "abc") is False
    assert h.strict_compare("==", [LyingStr("a"), (1, 2.0)], ["a", (1, 2)]) is True
    assert h.strict_compare("==", {"k": {1, 2}}, {"k": {2, 1}}) is True
    assert h.strict_compare("in", 2, [1, 2, 3]) is True
    assert h.strict_compare("==", True, 1) is True  # Python's own numeric equality is kept
    with pytest.raises(h.StrictTypeError):
        h.strict_binary("-", AlwaysEqual(), 1.5)
    assert h.strict_binary("+", 1, 2) == 3 and h.strict_binary("|", int, None) == int | None


def test_strict_compare_of_the_answers_own_class_with_itself_is_native():
    a, b = AlwaysEqual(), AlwaysEqual()
    assert h.strict_compare("==", a, b) is True
    last = []
    assert h.strict_compare("==", [1], [2], last) is False and last == ["==", "[1]", "[2]"]


def test_normalise_handles_cycles_and_opaque_keys():
    loop = []
    loop.append(loop)
    assert h.has_opaque(h.normalise(loop))
    assert type(h.normalise({AlwaysEqual(): 1})) is h._Opaque


def test_path_checks_resolve_relative_paths_and_links():
    links = {"/dev/fd": "/proc/self/fd", "/tmp/l": "../proc/self/mem"}

    def readlink(path):
        if path in links:
            return links[path]
        raise OSError

    assert h.path_allowed("data.txt", "/workspace", readlink)
    assert h.path_allowed(3, "/workspace", readlink)
    for bad in ("/proc/self/mem", "../proc/self/mem", "/dev/fd/0", b"/proc/1/mem", "/tmp/l", "//proc//self"):
        assert not h.path_allowed(bad, "/workspace", readlink), bad
    assert not h.path_allowed(type("P", (), {"__fspath__": lambda s: "x"})(), "/workspace", readlink)


def _line(nonce: str, summary: dict) -> str:
    payload = repr(summary).encode()
    tag = hmac.new(bytes.fromhex(nonce), payload, "sha256").hexdigest()
    return f"{REPORT_MARKER} {tag} {payload.hex()}"


def test_find_report_accepts_only_the_nonces_tag():
    nonce, other = "11" * 32, "22" * 32
    summary = {"version": 1, "total": 1, "kinds": ["ok"]}
    stdout = f"noise\n{_line(other, summary)}\n{REPORT_MARKER} {'0' * 64} {repr(summary).encode().hex()}\n"
    assert find_report(stdout, nonce) is None
    assert find_report(stdout + _line(nonce, summary) + "\n", nonce) == summary


def test_report_from_summary_requires_every_test():
    rw = rewrite_tests("assert f(1) == 2\nassert f(2) == 3")
    ok = {"version": 1, "total": 2, "kinds": ["ok", "ok"], "failures": [], "answer": ["ok", ""], "timeout": None}
    assert report_from_summary(ok, rw).reward == 1.0
    assert report_from_summary({**ok, "kinds": ["ok"]}, rw).kind == "no_proof"
    assert report_from_summary({**ok, "total": 1}, rw).kind == "no_proof"
    failed = {**ok, "kinds": ["ok", "assertion"], "failures": [[1, "assertion", "AssertionError", 1]]}
    report = report_from_summary(failed, rw)
    assert (report.kind, report.passed, report.failed_test) == ("assertion", 1, "assert f(2) == 3")
    timeout = {**ok, "kinds": ["ok"], "timeout": 1}
    assert report_from_summary(timeout, rw).to_dict()["failed_test"] == "assert f(2) == 3"
    exited = {**ok, "kinds": [], "answer": ["exit_before_tests", "SystemExit: 0"]}
    assert report_from_summary(exited, rw).kind == "exit_before_tests"


def test_program_binds_nothing_at_module_level():
    import dis

    compiled = compile(build_program("def f(x):\n    return x"), "<p>", "exec")
    assert not [i for i in dis.get_instructions(compiled) if i.opname in ("STORE_NAME", "STORE_GLOBAL")]


def test_normalise_output():
    assert normalise_output(" 3  4 \r\n\n\n") == ["3 4"]
    assert normalise_output("a\n\nb") == ["a", "", "b"]
