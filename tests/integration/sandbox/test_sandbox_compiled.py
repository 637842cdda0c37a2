"""C and C++ through `/run_code`: compiled inside the sandbox, then run, with SandboxFusion's compile_result."""

from __future__ import annotations

import base64

import pytest
from sandbox_testlib import assert_benign, run

pytestmark = pytest.mark.slow

HELLO = "#include <iostream>\nint main() { int n; std::cin >> n; std::cout << n * 2 << std::endl; return 0; }\n"


@pytest.fixture
def cpp(http):
    if "cpp" not in http.get("/health").json()["languages"]:
        pytest.skip("no g++ on this machine (make setup installs it)")
    return http


def test_cpp_compiles_and_runs_with_stdin(cpp):
    body = run(cpp, HELLO, language="cpp", stdin="21")
    assert body["status"] == "Success", body
    comp, result = body["compile_result"], body["run_result"]
    assert comp["status"] == "Finished" and comp["return_code"] == 0 and comp["execution_time"] > 0
    assert result["status"] == "Finished" and result["return_code"] == 0 and result["stdout"] == "42\n"


def test_cpp_compile_error_is_failed_without_run_result(cpp):
    body = run(cpp, "int main() {\n    object i = ?;\n    return 0;\n}\n", language="cpp")
    assert body["status"] == "Failed" and body["run_result"] is None, body
    comp = body["compile_result"]
    assert comp["status"] == "Finished" and comp["return_code"] != 0 and "error" in comp["stderr"]
    assert "main.cpp" in comp["stderr"]


def test_cpp_run_timeout(cpp):
    body = run(cpp, "int main() { for (;;) {} }", language="cpp", run_timeout=1)
    assert body["status"] == "Failed" and body["exit_reason"] == "timeout", body
    assert body["compile_result"]["return_code"] == 0
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["run_result"]["return_code"] is None
    assert_benign(cpp)


def test_compile_timeout_is_separate_from_run_timeout(cpp):
    # bits/stdc++.h alone takes the compiler far longer than 10 ms on any machine.
    body = run(cpp, "#include <bits/stdc++.h>\nint main() { return 0; }", language="cpp", compile_timeout=0.01,
               run_timeout=30)
    assert body["status"] == "Failed" and body["run_result"] is None, body
    assert body["compile_result"]["status"] == "TimeLimitExceeded" and body["compile_result"]["return_code"] is None
    assert body["exit_reason"] == "timeout"
    assert_benign(cpp)


def test_cpp_assertion_and_signal(cpp):
    body = run(cpp, "#include <cassert>\nint main() { assert(1 == 2); }", language="cpp")
    assert body["status"] == "Failed" and body["signal"] == "SIGABRT", body
    assert "Assertion" in body["run_result"]["stderr"] and body["run_result"]["return_code"] == 134


def test_cpp_files_in_and_out(cpp):
    code = ('#include <fstream>\n#include <string>\nint main() { std::ifstream in("in.txt"); std::string s; in >> s;\n'
            '  std::ofstream("out.txt") << s << s; return 0; }')
    body = run(cpp, code, language="cpp", files={"in.txt": base64.b64encode(b"ab").decode()},
               fetch_files=["out.txt"])
    assert body["status"] == "Success", body
    assert base64.b64decode(body["files"]["out.txt"]) == b"abab"


def test_compiler_is_inside_the_sandbox(cpp):
    # The compiler sees the sandbox's root, not the host's: no host secrets, no repository.
    body = run(cpp, '#include "/etc/shadow"\nint main() {}', language="cpp")
    assert body["run_result"] is None and "No such file" in body["compile_result"]["stderr"], body
    # ... and its memory limit: a preprocessor reading /dev/zero is OOM-killed by the sandbox's cgroup.
    body = run(cpp, '#include "/dev/zero"\nint main() {}', language="cpp", memory_limit_MB=128, compile_timeout=30)
    assert body["status"] == "Failed" and body["exit_reason"] == "oom" and body["run_result"] is None, body
    assert_benign(cpp)


def test_c_compiles_and_runs(http):
    if "c" not in http.get("/health").json()["languages"]:
        pytest.skip("no gcc on this machine")
    body = run(http, '#include <stdio.h>\n#include <math.h>\nint main(void) { printf("%.1f\\n", sqrt(16.0)); '
                     "return 3; }", language="c")
    assert body["status"] == "Failed" and body["compile_result"]["return_code"] == 0, body
    assert body["run_result"]["stdout"] == "4.0\n" and body["run_result"]["return_code"] == 3
