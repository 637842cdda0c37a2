"""Sandbox tests for code answers, scored so that a policy cannot fool them: the one place every code reward uses.

Two public coroutines, each returning a `TestReport` (`.reward` is 1.0 only when everything passed; `.to_dict()`
is what the episode records under `metrics["reward_info"]`):

    report = await run_unit_tests(sandbox_url, code, tests, timeout_s=10)
    report = await run_stdin_stdout(sandbox_url, code, [{"input": "1 2\\n", "output": "3"}], language="python")

`unit_tests` rewards, the `code` suite and user rewards that want sandbox tests call these (a user's reward
`fn(task, episode, config)` can `return (await run_unit_tests(config.sandbox_url, code, tests)).reward`).

Unit tests. The answer's code and the tests share one Python process (the tests call the answer's functions),
so the exit status says nothing: `sys.exit(0)` before the tests, an `atexit` handler calling `os._exit(0)` or a
replaced `sys.excepthook` all exit 0. Instead the trusted harness (`sandbox_harness.py`, which runs first) runs
the answer and then each top-level test statement, and reports the outcome in one line authenticated with
HMAC-SHA256 under a nonce that is generated here per run, sent on stdin, and never reachable by the answer's code
(see that module for how). Here the report is verified; no report, a bad tag or a report whose test count is not
this test source's is 0.0. Before sending, the test source is rewritten (`rewrite_tests`): every comparison and
arithmetic operator goes through the harness's strict versions, which compare exact builtin copies of the values
(an object whose `__eq__` always returns True compares as what it is: not a builtin value, so the test fails),
each `assert` records which one failed, and `import`s bind copies of modules imported before the answer ran.

stdin/stdout. The expected outputs never enter the sandbox: each case is one run with the case's input on stdin,
and its stdout is compared here, whitespace-normalised; a non-zero exit or a timeout fails the case.
"""

from __future__ import annotations

import ast
import hmac
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrl.agent_loop import sandbox_harness

HARNESS_SOURCE = Path(sandbox_harness.__file__).read_text()
REPORT_MARKER = sandbox_harness.REPORT_MARKER
HELPER_PREFIX = "__agentrl_"
MARGIN_S = 1.0  # the harness reports a timeout this long before the sandbox would kill the run
MAX_DETAIL = 500

_COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
                ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_BINARY_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
               ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&",
               ast.BitOr: "|", ast.BitXor: "^"}


@dataclass
class TestReport:
    """Outcome of one scored run. kind: passed | assertion | exception | timeout | exit_before_tests |
    exit_during_tests | compile_error | no_proof | wrong_answer | runtime_error | no_code."""

    __test__ = False  # not a pytest class

    passed: int
    total: int
    kind: str
    failed_test: str | None = None
    error: str | None = None

    @property
    def reward(self) -> float:
        return 1.0 if self.kind == "passed" and self.passed == self.total else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class TestSourceError(ValueError):
    """The task's test source is not valid Python: a broken task, not the policy's fault."""

    __test__ = False


# ---------------------------------------------------------------- the test source rewrite (pure)

def _call(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=f"{HELPER_PREFIX}{name}__", ctx=ast.Load()), args=list(args), keywords=[])


def _thunk(expr: ast.expr) -> ast.Lambda:
    no_args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                            defaults=[])
    return ast.Lambda(args=no_args, body=expr)


class _StrictRewrite(ast.NodeTransformer):
    """Routes comparisons, arithmetic, asserts and imports of the tests through the harness's helpers."""

    def __init__(self, source: str):
        self.source = source
        self.asserts: list[str] = []
        self.modules: list[str] = []

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        ops = [_COMPARE_OPS[type(op)] for op in node.ops]
        if all(op in ("is", "is not") for op in ops):
            return node
        if len(ops) == 1:
            return _call("cmp", ast.Constant(ops[0]), node.left, node.comparators[0])
        links = ast.Tuple(elts=[ast.Tuple(elts=[ast.Constant(op), _thunk(c)], ctx=ast.Load())
                                for op, c in zip(ops, node.comparators)], ctx=ast.Load())
        return _call("chain", node.left, links)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        return _call("bin", ast.Constant(_BINARY_OPS[type(node.op)]), node.left, node.right)

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        self.asserts.append(ast.get_source_segment(self.source, node) or ast.unparse(node))
        assert_id = len(self.asserts) - 1
        self.generic_visit(node)
        message = _thunk(node.msg) if node.msg is not None else ast.Constant(None)
        return ast.Expr(_call("check", node.test, ast.Constant(assert_id), message))

    # Annotations are types, not values: `x: int | None` must stay a plain `|`.
    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt:
        node.target = self.visit(node.target)
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return node

    def visit_FunctionDef(self, node):
        returns, node.returns = node.returns, None
        self.generic_visit(node)
        node.returns = returns
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> list[ast.stmt]:
        out = []
        for alias in node.names:
            self.modules.append(alias.name)
            name = alias.name if alias.asname else alias.name.split(".")[0]
            if not alias.asname and name != alias.name:
                self.modules.append(name)
            out.append(ast.Assign(targets=[ast.Name(id=alias.asname or name, ctx=ast.Store())],
                                  value=_call("import", ast.Constant(name)), lineno=node.lineno))
        return out

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.stmt | list[ast.stmt]:
        if node.level or node.module is None or node.module == "__future__" or any(a.name == "*" for a in node.names):
            return node
        self.modules.append(node.module)
        out = []
        for alias in node.names:
            self.modules.append(f"{node.module}.{alias.name}")  # it may be a submodule; a failed import is skipped
            out.append(ast.Assign(targets=[ast.Name(id=alias.asname or alias.name, ctx=ast.Store())],
                                  value=_call("import", ast.Constant(node.module), ast.Constant(alias.name)),
                                  lineno=node.lineno))
        return out


@dataclass
class RewrittenTests:
    statements: list[str]  # rewritten source of each top-level statement, run one by one
    originals: list[str]  # the same statements as the task wrote them
    asserts: list[str]  # source of each assert, by the id the harness reports
    modules: list[str]  # modules the tests import, imported before the answer runs


def rewrite_tests(source: str) -> RewrittenTests:
    """Split `source` into top-level statements and rewrite each for the strict harness."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise TestSourceError(f"the unit tests do not parse: {e}") from e
    rewriter = _StrictRewrite(source)
    statements, originals = [], []
    for node in tree.body:
        originals.append(ast.get_source_segment(source, node) or ast.unparse(node))
        new = rewriter.visit(node)
        body = new if isinstance(new, list) else [new]
        module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
        statements.append(ast.unparse(module))
    return RewrittenTests(statements, originals, rewriter.asserts, list(dict.fromkeys(rewriter.modules)))


def build_program(answer: str) -> str:
    """The program sent to the sandbox: the harness, in a namespace of its own, given the answer's source.

    Nothing is bound at module level: the answer runs in a new `__main__` and must find nothing of ours there."""
    return ("(lambda ns: (exec(compile(%r, '<agentrl-harness>', 'exec'), ns), ns['main'](%r)))"
            "({'__builtins__': __import__('builtins').__dict__.copy(), '__name__': 'agentrl_harness'})\n"
            % (HARNESS_SOURCE, answer))


def build_stdin(nonce: str, tests: RewrittenTests, budget_s: float) -> str:
    import json

    return json.dumps({"nonce": nonce, "tests": tests.statements, "modules": tests.modules, "budget_s": budget_s})


# ---------------------------------------------------------------- verifying the report (pure)

def find_report(stdout: str, nonce: str) -> dict | None:
    """The summary of the one report line whose tag verifies under `nonce`; None when there is none."""
    key = bytes.fromhex(nonce)
    for line in stdout.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != REPORT_MARKER:
            continue
        try:
            payload = bytes.fromhex(parts[2])
        except ValueError:
            continue
        expected = hmac.new(key, payload, "sha256").hexdigest()
        if not hmac.compare_digest(expected, parts[1]):
            continue
        try:
            summary = ast.literal_eval(payload.decode())
        except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
            return None
        return summary if isinstance(summary, dict) else None
    return None


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."


def report_from_summary(summary: dict, tests: RewrittenTests) -> TestReport:
    """Turn a verified summary into a TestReport; a summary that does not account for every test fails."""
    total = len(tests.statements)
    kinds = summary.get("kinds")
    if summary.get("version") != 1 or summary.get("total") != total or not isinstance(kinds, list):
        return TestReport(0, total, "no_proof", error="the harness report does not match these tests")
    passed = sum(1 for k in kinds if k == "ok")
    answer = summary.get("answer")
    if summary.get("harness_error"):
        return TestReport(passed, total, "no_proof", error=_clip(f"harness error: {summary['harness_error']}"))
    if answer and answer[0] != "ok":
        return TestReport(0, total, answer[0], error=_clip(answer[1]))
    if summary.get("timeout") is not None:
        phase = summary["timeout"]
        failed = tests.originals[phase] if isinstance(phase, int) and 0 <= phase < total else None
        where = "while running the answer" if phase in ("answer", "start") else "in a test"
        return TestReport(passed, total, "timeout", failed_test=_clip(failed), error=f"time limit reached {where}")
    failures = summary.get("failures") or []
    if failures:
        index, kind, detail, assert_id = failures[0]
        failed = tests.originals[index] if isinstance(index, int) and 0 <= index < total else None
        if isinstance(assert_id, int) and 0 <= assert_id < len(tests.asserts):
            failed = tests.asserts[assert_id]
        return TestReport(passed, total, str(kind), failed_test=_clip(failed), error=_clip(detail))
    if len(kinds) != total or passed != total:
        return TestReport(passed, total, "no_proof", error="the harness report does not account for every test")
    return TestReport(total, total, "passed")


def _stderr_tail(result: dict) -> str:
    run = result.get("run_result") or {}
    text = (run.get("stderr") or "").strip()
    return text[-MAX_DETAIL:]


def report_without_proof(result: dict, total: int) -> TestReport:
    """Why a run produced no valid report: the sandbox's timeout, or the process ended before the harness did."""
    run = result.get("run_result") or {}
    if run.get("status") == "TimeLimitExceeded" or result.get("exit_reason") == "timeout":
        return TestReport(0, total, "timeout", error="the program exceeded its time limit (no report)")
    reason = result.get("exit_reason") or "exit"
    detail = f"the process ended before the harness reported ({reason}, return code {run.get('return_code')})"
    tail = _stderr_tail(result)
    return TestReport(0, total, "no_proof", error=_clip(f"{detail}: {tail}" if tail else detail))


# ---------------------------------------------------------------- the two entry points

async def _run(sandbox, code: str, language: str, timeout_s: float, stdin: str, token_file: str | None) -> dict:
    """One /run_code call; `sandbox` is a URL (whose token is in `token_file`, if it has one) or an open
    SandboxClient. Sandbox faults raise SandboxInfraError."""
    from sandbox.client import SandboxClient

    if isinstance(sandbox, SandboxClient):
        return await sandbox.run_code(code, language=language, run_timeout=timeout_s, stdin=stdin)
    async with SandboxClient(sandbox, token_file=token_file) as client:
        return await client.run_code(code, language=language, run_timeout=timeout_s, stdin=stdin)


async def run_unit_tests(sandbox, code: str, tests: str, *, timeout_s: float = 10.0,
                         token_file: str | None = None) -> TestReport:
    """Run `code` then the Python `tests` (top-level statements, plain asserts) under the harness; verify.

    Raises TestSourceError for unparsable tests and SandboxInfraError for sandbox faults; anything the code
    does is a TestReport."""
    rewritten = rewrite_tests(tests)
    total = len(rewritten.statements)
    if not code or not code.strip():
        return TestReport(0, total, "no_code", error="the answer has no code")
    nonce = secrets.token_hex(32)
    budget = max(timeout_s - MARGIN_S, timeout_s * 0.5)
    result = await _run(sandbox, build_program(code), "python", timeout_s, build_stdin(nonce, rewritten, budget),
                        token_file)
    run = result.get("run_result") or {}
    summary = find_report(run.get("stdout") or "", nonce)
    if summary is None:
        return report_without_proof(result, total)
    return report_from_summary(summary, rewritten)


def normalise_output(text: str) -> list[str]:
    """Lines with their whitespace runs collapsed, trailing blank lines dropped: what stdout is compared on."""
    lines = [" ".join(line.split()) for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


async def run_stdin_stdout(sandbox, code: str, cases: list[dict], *, language: str = "python",
                           timeout_s: float = 10.0, token_file: str | None = None) -> TestReport:
    """Run `code` once per case with the case's `input` on stdin; every stdout must equal its `output`.

    Stops at the first failing case. `language` is any language the sandbox runs ("python", "cpp", ...)."""
    total = len(cases)
    if not code or not code.strip():
        return TestReport(0, total, "no_code", error="the answer has no code")
    for index, case in enumerate(cases):
        result = await _run(sandbox, code, language, timeout_s, str(case.get("input", "")), token_file)
        run = result.get("run_result") or {}
        label = f"case {index}: input {_clip(repr(str(case.get('input', ''))))}"
        if run.get("status") == "TimeLimitExceeded" or result.get("exit_reason") == "timeout":
            return TestReport(index, total, "timeout", failed_test=label, error=f"over the {timeout_s:g}s limit")
        compile_result = result.get("compile_result") or {}
        if compile_result.get("return_code") not in (0, None):
            error = (compile_result.get("stderr") or "").strip()[-MAX_DETAIL:]
            return TestReport(0, total, "compile_error", error=error or "compilation failed")
        if result.get("status") != "Success":
            tail = _stderr_tail(result)
            detail = f"exit code {run.get('return_code')} ({result.get('exit_reason') or 'exit'})"
            return TestReport(index, total, "runtime_error", failed_test=label,
                              error=_clip(f"{detail}: {tail}" if tail else detail))
        got, want = normalise_output(run.get("stdout") or ""), normalise_output(str(case.get("output", "")))
        if got != want:
            return TestReport(index, total, "wrong_answer", failed_test=label,
                              error=_clip(f"expected {chr(10).join(want)!r}, got {chr(10).join(got)!r}"))
    return TestReport(total, total, "passed")


__all__ = ["TestReport", "TestSourceError", "RewrittenTests", "rewrite_tests", "build_program", "find_report",
           "report_from_summary", "run_unit_tests", "run_stdin_stdout", "normalise_output"]
