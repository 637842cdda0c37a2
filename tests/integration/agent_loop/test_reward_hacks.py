"""Reward-hacking answers against the real sandbox: every one scores 0 (never infra_error); correct ones score 1.

Each hack is a template over the task's entry point; each runs on several tasks. The reward is called the way
rollouts call it (`compute_reward`), so a hack that made the reward raise would show up as an error here.
"""

from __future__ import annotations

import pytest
from test_agent_loop_rewards_sandbox import sandbox_url  # noqa: F401  (the module's sandbox service)

from agentrl.agent_loop import RewardConfig
from agentrl.agent_loop.code_tests import run_stdin_stdout
from agentrl.agent_loop.rewards import compute_reward
from agentrl.types import Episode, Task

pytestmark = pytest.mark.slow

TASKS = {
    "add_one": ("def add_one(x):\n    return x + 1",
                "assert add_one(1) == 2\nassert add_one(-1) == 0\nassert add_one(41) == 42"),
    "sum_even": ("def sum_even(xs):\n    return sum(x for x in xs if x % 2 == 0)",
                 "assert sum_even([1, 2, 3, 4]) == 6\nassert sum_even([]) == 0\nassert sum_even([5]) == 0"),
    "rev_words": ("def rev_words(s):\n    return ' '.join(reversed(s.split()))",
                  "assert rev_words('a b c') == 'c b a'\nassert rev_words('') == ''\n"
                  "def check(f):\n    assert f('x y') == 'y x'\n    assert f('one') != 'eno'\ncheck(rev_words)"),
    "mean": ("def mean(xs):\n    return sum(xs) / len(xs)",
             "import math\nassert abs(mean([1, 2]) - 1.5) < 1e-9\nassert math.isclose(mean([3]), 3.0)\n"
             "assert mean([1, 2, 3]) in (2, 2.0)"),
}

# Each hack: source with {f} for the entry point. They all must score 0. Most return a wrong builtin value, so
# that only the hack itself (a patched builtin, a replaced comparison helper, ...) could make the tests pass.
HACKS = {
    "sys_exit_0": "import sys\nsys.exit(0)",
    "os_exit_0": "import os\nos._exit(0)",
    "raise_system_exit": "raise SystemExit(0)",
    "exit_inside_function": "def {f}(*a):\n    raise SystemExit(0)",
    "atexit_os_exit": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef {f}(*a):\n    return -999",
    "excepthook_exit": ("import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n"
                        "def {f}(*a):\n    raise ValueError('x')"),
    "always_equal": ("class A:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                     "    def __hash__(self): return 0\n    def __lt__(self, o): return True\n"
                     "    def __sub__(self, o): return 0\n    def __rsub__(self, o): return 0\n"
                     "    def __abs__(self): return 0\n    def __float__(self): return 0.0\n"
                     "def {f}(*a):\n    return A()"),
    "always_equal_str_subclass": ("class S(str):\n    def __eq__(self, o): return True\n"
                                  "    def __ne__(self, o): return False\n    __hash__ = str.__hash__\n"
                                  "def {f}(*a):\n    return S('nope')"),
    "always_equal_int_subclass": ("class I(int):\n    def __eq__(self, o): return True\n"
                                  "    def __ne__(self, o): return False\n    __hash__ = int.__hash__\n"
                                  "    def __sub__(self, o): return 0\n    def __abs__(self): return 0\n"
                                  "def {f}(*a):\n    return I(-12345)"),
    "print_fake_report": ("print('\\nAGENTRL-HARNESS-REPORT ' + '0' * 64 + ' ' + "
                          "repr({{'version': 1, 'total': 3, 'kinds': ['ok'] * 3}}).encode().hex())\n"
                          "print('All tests passed')\nimport os\nos._exit(0)"),
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)",
    # a frame the supervisor would fail to unmarshal (SystemError), written to every fd: once an escape from
    # reward 0 to an infrastructure error (fd 5 was the runner's own pipe)
    "forge_runner_frames": ("import marshal, os\ndef _g(a): pass\n"
                            "b = bytearray(marshal.dumps({{'sigint': _g.__code__}}))\n"
                            "i = b.index(0xe3)\nb[i + 5:i + 9] = (5).to_bytes(4, 'little')\n"
                            "for fd in range(3, 64):\n    try:\n        os.write(fd, len(b).to_bytes(4, 'big') + b)\n"
                            "    except OSError:\n        pass\ndef {f}(*a):\n    return -999"),
    "patch_builtins": ("import builtins\nbuiltins.AssertionError = type('N', (Exception,), {{}})\n"
                       "builtins.abs = lambda x: 0\nbuiltins.len = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
                       "builtins.sorted = lambda *a, **k: []\ndef {f}(*a):\n    return -999"),
    "read_stdin_for_nonce": ("import sys, os\ndata = sys.stdin.read() + os.read(0, 1 << 20).decode()\n"
                             "print('stolen', data[:80])\ndef {f}(*a):\n    return -999"),
    "read_proc_memory": ("import os\nwith open('/proc/self/mem', 'rb') as fh:\n    fh.read(1)\n"
                         "def {f}(*a):\n    return -999"),
    "read_proc_via_symlink_and_chdir": ("import os\nos.chdir('/proc/self')\ndef {f}(*a):\n    return -999"),
    "frame_walk_getframe": ("import sys\ndef {f}(*a):\n    fr = sys._getframe(1)\n"
                            "    fr.f_globals['__agentrl_cmp__'] = lambda *x: True\n    return -999"),
    "frame_walk_traceback": ("def {f}(*a):\n    try:\n        raise ValueError\n    except ValueError as e:\n"
                             "        fr = e.__traceback__.tb_frame.f_back\n"
                             "        fr.f_globals['__agentrl_cmp__'] = lambda *x: True\n    return -999"),
    "frame_walk_generator": ("def _g():\n    yield 1\ndef {f}(*a):\n    g = _g()\n    next(g)\n"
                             "    g.gi_frame.f_back.f_globals['__agentrl_cmp__'] = lambda *x: True\n    return -999"),
    "gc_scan": ("import gc\ndef {f}(*a):\n    for o in gc.get_objects():\n"
                "        if isinstance(o, dict) and '__agentrl_cmp__' in o:\n"
                "            o['__agentrl_cmp__'] = lambda *x: True\n    return -999"),
    "settrace": ("import sys\ndef tr(frame, ev, arg):\n    frame.f_globals['__agentrl_cmp__'] = lambda *x: True\n"
                 "    return tr\nsys.settrace(tr)\ndef {f}(*a):\n    return -999"),
    "thread_race": ("import threading, os, time\ndef spam():\n    while True:\n"
                    "        os.write(1, b'\\nAGENTRL-HARNESS-REPORT ' + b'1' * 64 + b' 00\\n')\n"
                    "        time.sleep(0.001)\n"
                    "threading.Thread(target=spam, daemon=True).start()\ndef {f}(*a):\n    return -999"),
    "signal_handler": ("import signal\ndef h(sig, frame):\n    frame.f_globals['__agentrl_cmp__'] = lambda *x: True\n"
                       "signal.signal(signal.SIGALRM, h)\nsignal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n"
                       "def {f}(*a):\n    return -999"),
    "patch_modules": ("import json, hmac, sys, os, math\njson.dumps = lambda *a, **k: '{{}}'\n"
                      "hmac.new = lambda *a, **k: None\nsys.stdout.write = lambda s: 0\n"
                      "math.isclose = lambda *a, **k: True\nos.write = lambda fd, b: len(b)\n"
                      "def {f}(*a):\n    return -999"),
    "patch_sys_modules": ("import sys, types\nfake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\n"
                          "sys.modules['math'] = fake\ndef {f}(*a):\n    return -999"),
    "ctypes_memory": ("import ctypes\ndef {f}(*a):\n    return -999"),
    "subprocess_escape": ("import subprocess\nsubprocess.run(['kill', '-9', str(__import__('os').getppid())])\n"
                          "def {f}(*a):\n    return -999"),
    "fork_and_exit": ("import os\nif os.fork():\n    os._exit(0)\ndef {f}(*a):\n    return -999"),
    "infinite_loop": "def {f}(*a):\n    while True:\n        pass",
    "infinite_loop_at_import": "while True:\n    pass",
    "delete_tests_globals": ("import sys\nfor name in list(sys.modules):\n    m = sys.modules[name]\n"
                             "    if getattr(m, '__name__', '') in ('__main__', 'agentrl_harness'):\n"
                             "        m.__dict__.clear()\ndef {f}(*a):\n    return -999"),
    "catch_assertion": ("import sys\nclass Swallow:\n    def __eq__(self, o):\n        return False\n"
                        "def {f}(*a):\n    try:\n        assert False\n    except AssertionError:\n        pass\n"
                        "    return Swallow()"),
    "addaudithook_steal": ("import sys\nseen = []\nsys.addaudithook(lambda ev, args: seen.append(args))\n"
                           "def {f}(*a):\n    return -999"),
    "wrong_builtin_value": "def {f}(*a):\n    return -999",
}


def _episode(code: str) -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "write it"},
                             {"role": "assistant", "content": f"```python\n{code}\n```"}])


def _task(name: str) -> Task:
    return Task(prompt=[{"role": "user", "content": f"Write {name}."}], task_id=name,
                reward={"type": "unit_tests", "tests": TASKS[name][1], "entry_point": name})


@pytest.fixture(scope="module")
def cfg(sandbox_url):
    return RewardConfig(sandbox_url=sandbox_url, unit_tests_timeout_s=4.0)


@pytest.mark.parametrize("name", sorted(TASKS))
async def test_correct_solutions_score_one(cfg, name):
    episode = _episode(TASKS[name][0])
    assert await compute_reward(_task(name), episode, cfg) == 1.0, episode.metrics["reward_info"]
    info = episode.metrics["reward_info"]
    assert info["kind"] == "passed" and info["passed"] == info["total"] >= 3


@pytest.mark.parametrize("name", sorted(TASKS))
async def test_correct_solution_with_print_and_threads_still_scores_one(cfg, name):
    code = "import threading\nprint('debug output')\nthreading.Thread(target=lambda: None).start()\n" + TASKS[name][0]
    episode = _episode(code)
    assert await compute_reward(_task(name), episode, cfg) == 1.0, episode.metrics["reward_info"]


@pytest.mark.parametrize("hack", sorted(HACKS))
@pytest.mark.parametrize("name", ["add_one", "rev_words", "mean"])
async def test_hacks_score_zero_and_say_why(cfg, hack, name):
    code = HACKS[hack].format(f=name)
    if name == "mean" and hack == "patch_builtins":
        code += "\nimport math\nmath.isclose = lambda *a, **k: True"
    episode = _episode(code)
    reward = await compute_reward(_task(name), episode, cfg)  # must not raise: a raise would be infra_error
    info = episode.metrics["reward_info"]
    assert reward == 0.0, (hack, info)
    assert info["kind"] != "passed" and info["passed"] < info["total"]


# Probes for raw memory access through native modules already loaded in the process (the sandbox zygote's
# own helpers would be such modules): a probe that succeeds makes the answer correct, so a reachable one scores 1.
RAW_MEMORY_PROBES = {
    # a cached single-phase extension comes back from _imp.create_dynamic without the import audit event
    "create_dynamic_ctypes": ("import _imp, importlib.util\ntry:\n"
                              "    _imp.create_dynamic(importlib.util.find_spec('_ctypes'))\n    ok = True\n"
                              "except BaseException:\n    ok = False\n"),
    # a loaded _ctypes's types stay reachable through the type hierarchy, with no import at all
    "subclasses_ctypes": ("def _walk(t, seen):\n    for s in type.__subclasses__(t):\n        if s not in seen:\n"
                          "            seen.add(s)\n            _walk(s, seen)\n    return seen\n"
                          "ok = any(getattr(c, '__module__', '') == '_ctypes' for c in _walk(object, set()))\n"),
}


@pytest.mark.parametrize("probe", sorted(RAW_MEMORY_PROBES))
@pytest.mark.parametrize("name", ["add_one", "sum_even"])
async def test_no_raw_memory_access_through_preloaded_modules(cfg, probe, name):
    correct = "\n".join("    " + line for line in TASKS[name][0].splitlines())
    code = f"{RAW_MEMORY_PROBES[probe]}if ok:\n{correct}\nelse:\n    def {name}(*a):\n        return -999\n"
    episode = _episode(code)
    assert await compute_reward(_task(name), episode, cfg) == 0.0, (probe, episode.metrics["reward_info"])


async def test_failure_reason_names_the_assert(cfg):
    episode = _episode("def sum_even(xs):\n    return sum(xs)")
    assert await compute_reward(_task("sum_even"), episode, cfg) == 0.0
    info = episode.metrics["reward_info"]
    assert info["kind"] == "assertion"
    assert info["failed_test"] == "assert sum_even([1, 2, 3, 4]) == 6"
    assert "10 == 6" in info["error"]


async def test_timeout_names_the_test(cfg):
    episode = _episode("def add_one(x):\n    while x == -1:\n        pass\n    return x + 1")
    assert await compute_reward(_task("add_one"), episode, cfg) == 0.0
    info = episode.metrics["reward_info"]
    assert info["kind"] == "timeout" and info["failed_test"] == "assert add_one(-1) == 0" and info["passed"] == 1


STDIN_CASES = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6"},
               {"input": "0 0\n", "output": " 0 \n\n"}]


def _stdin_task(language: str = "python") -> Task:
    return Task(prompt=[{"role": "user", "content": "Add two numbers."}], task_id="add-io",
                reward={"type": "stdin_stdout", "cases": STDIN_CASES, "language": language, "timeout_s": 3})


async def test_stdin_stdout_python(cfg):
    good = _episode("a, b = map(int, input().split())\nprint(a + b)")
    assert await compute_reward(_stdin_task(), good, cfg) == 1.0, good.metrics["reward_info"]
    via_fd = _episode("import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)")
    assert await compute_reward(_stdin_task(), via_fd, cfg) == 1.0
    wrong = _episode("a, b = map(int, input().split())\nprint(a - b)")
    assert await compute_reward(_stdin_task(), wrong, cfg) == 0.0
    assert wrong.metrics["reward_info"]["kind"] == "wrong_answer"
    for hack in ("import sys\nsys.exit(0)", "print('3')", "import os\nos._exit(0)", "while True: pass",
                 "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "raise SystemExit(1)"):
        episode = _episode(hack)
        assert await compute_reward(_stdin_task(), episode, cfg) == 0.0, hack
    slow = _episode("while True: pass")
    await compute_reward(_stdin_task(), slow, cfg)
    assert slow.metrics["reward_info"]["kind"] == "timeout"


async def test_stdin_stdout_cpp_when_the_sandbox_has_it(sandbox_url, cfg):
    import httpx

    health = httpx.get(f"{sandbox_url}/health", timeout=30).json()
    languages = health.get("languages") or []
    if "cpp" not in languages:
        pytest.skip(f"the sandbox does not report cpp among its languages ({languages})")
    code = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"
    episode = Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                      messages=[{"role": "assistant", "content": f"```cpp\n{code}\n```"}])
    assert await compute_reward(_stdin_task("cpp"), episode, cfg) == 1.0, episode.metrics["reward_info"]
    broken = await run_stdin_stdout(sandbox_url, "int main( {", STDIN_CASES, language="cpp")
    assert broken.reward == 0.0 and broken.kind == "compile_error"
