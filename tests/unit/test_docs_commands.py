"""Every command in README.md, docs/*.md and examples/*/README.md runs or parses, so none can drift.

Commands are the lines of ```bash / ```sh fences and the `$ ` lines of ```console fences. Each page's commands
run in order in a workspace of their own, the state of a fresh clone (copies of configs/ and examples/, no
runs/ or data/), so every command works after the ones above it on its page:

- cheap commands run for real: `agentrl` ones in this process (`agentrl.cli.main`), services (`... serve`) as
  subprocesses on free loopback ports that later commands of the page reach (the documented port is mapped to
  the free one in their arguments and in the workspace's config files), `curl` through httpx;
- expensive commands, listed in PARSED_ONLY with the reason, are parsed by the real argparse parser (or their
  target, script or extra is checked), and every path they name must exist in the repository or come from an
  earlier command of the page.

A command that is neither run nor on the list fails the test, as does a broken link between the pages.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from helpers import REPO_ROOT

from agentrl.cli import build_parser, main
from agentrl.services import agentrl_command, free_port, stop_process_group, wait_healthy

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
         *sorted((REPO_ROOT / "examples").glob("*/README.md"))]
COPIED_DIRS = ("configs", "examples", "recipes")  # what a page's commands may read; runs/ and data/ start empty
OUTPUT_ROOTS = ("runs", "data")  # paths under these must be produced by an earlier command, never the checkout's

# Commands that are only parsed, and why (prefix of the argv -> reason). Keep it short: everything cheap runs.
PARSED_ONLY = {
    ("make", "quickstart"): "14 min on 2 cores; tests/integration/test_quickstart.py runs the --smoke miniature",
    ("make", "test"): "the whole test suite, this test included",
    ("agentrl", "quickstart"): "minutes even with --smoke; tests/integration/test_quickstart.py runs it",
    ("agentrl", "train"): "a training run; here its own --check passes (config, model, every task row, rewards, "
                          "tools, loggers)",
    ("agentrl", "sft"): "a training run; here its own --check passes (config, model, every demonstration row)",
    ("agentrl", "eval"): "a minute or more of rollouts; tests/integration/evaluation runs the command",
    ("agentrl", "export"): "needs a checkpoint, which only a training run writes",
    ("agentrl", "view"): "serves until interrupted; tests/integration/viewer opens its page in a browser",
    ("agentrl", "replay"): "needs a recorded run; tests/integration/viewer replays one",
    ("agentrl", "bench"): "every benchmark runs for minutes",
    ("agentrl", "engine", "launch-sglang"): "needs GPUs and SGLang; the --dry-run form runs here",
    ("bash",): "the example launchers run for minutes (tests/integration/test_examples.py runs them); here the "
               "script exists and passes bash -n",
    ("pip", "install"): "needs the network; here every extra it names exists in pyproject.toml",
}
# Stand-ins for the reader's own files that a page names without producing: written as verl parquet rows (of a
# data_source verl scores, as verl's preprocessing writes them).
USER_FILES = ("data/train.parquet", "data/test.parquet")
NOT_PATHS = {"Qwen/Qwen2.5-3B-Instruct"}  # Hugging Face model ids, not files
SERVICE_HEALTH = {("agentrl", "tools", "serve"): "/health", ("agentrl", "sandbox", "serve"): "/v1/ping",
                  ("agentrl", "engine", "serve"): "/health", ("python", "-m", "sandbox"): "/v1/ping",
                  ("agentrl", "serve-policy"): "/health"}
OUTPUT_KEYS = ("trainer.run_dir=", "sft.run_dir=", "sft.output_dir=")  # overrides naming what a run writes
PATH_SUFFIXES = (".yaml", ".yml", ".jsonl", ".json", ".parquet", ".py", ".sh", ".txt", ".md")


@dataclass
class Command:
    page: str
    line: int
    text: str
    env: dict[str, str]
    argv: list[str]

    def where(self) -> str:
        return f"{self.page}:{self.line}: `{self.text}`"


def extract_commands(page: Path) -> list[Command]:
    """Commands of a page's bash/sh/console fences; `\\` continues a line, `#` starts a comment."""
    name = str(page.relative_to(REPO_ROOT))
    commands, fence, pending, start = [], None, "", 0
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        if fence not in ("bash", "sh", "console"):
            continue
        if fence == "console":
            if not (pending or stripped.startswith("$ ")):
                continue
            stripped = stripped.removeprefix("$ ") if not pending else stripped
        if not pending:
            start = number
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        tokens = shlex.split(pending, comments=True)
        if tokens:
            assert not {"&&", "||", ";", "|", ">", "<"} & set(tokens), f"{name}:{start}: one command per line"
            env = {}
            while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
                key, value = tokens.pop(0).split("=", 1)
                env[key] = value
            text = pending.split(" #")[0].strip()
            commands.append(Command(name, start, text, env, tokens))
        pending = ""
    return commands


def named_paths(tokens: list[str]) -> list[str]:
    """Repository-relative paths among argv tokens, override values (`k=v`, `k=[a,b]`) and `file.py:fn` specs;
    not the run directories that overrides name (a run writes them)."""
    out = []
    for token in tokens:
        if (token.startswith("-") and "=" not in token) or token.startswith(OUTPUT_KEYS):
            continue
        value = token.split("=", 1)[1] if "=" in token and not token.startswith(("{", "[")) else token
        for item in value.strip("[]").split(","):
            item = item.split(":", 1)[0] if ".py:" in item else item
            if (not item or "://" in item or item.startswith(("{", "'", '"', ".[")) or " " in item
                    or item in NOT_PATHS or item.startswith("/")):
                continue
            if "/" in item or item.endswith(PATH_SUFFIXES):
                out.append(item.rstrip("/"))
    return out


def parsed_only_reason(argv: list[str]) -> str | None:
    for prefix, reason in PARSED_ONLY.items():
        if tuple(argv[: len(prefix)]) == prefix:
            return reason
    return None


def call_main(argv: list[str]) -> tuple[int, str, str]:
    """`agentrl ARGV` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def run_in_process(argv: list[str]) -> str:
    """`agentrl ARGV` in this process; returns its stdout, fails with its output's tail unless it exits 0."""
    code, out, err = call_main(argv)
    if code != 0:
        raise AssertionError(f"exit {code}:\n{(out + err)[-3000:]}")
    return out


def parse(argv: list[str]):
    """argparse's verdict on `agentrl ARGV`; its usage error becomes the assertion message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(f"the agentrl parser rejects it: {err.getvalue().strip()[-1500:]}") from None


@dataclass
class Workspace:
    root: Path
    produced: set[str] = field(default_factory=set)  # outputs declared by parsed-only commands
    ports: dict[str, str | None] = field(default_factory=dict)  # documented port -> live port (None: skipped)
    originals: dict[Path, str] = field(default_factory=dict)
    services: list = field(default_factory=list)
    pending: list = field(default_factory=list)
    extras_installed: set[str] = field(default_factory=set)  # named by an earlier `pip install -e '.[...]'`

    def exists(self, path: str) -> bool:
        rel = Path(path)
        if (self.root / rel).exists() or any(path == p or path.startswith(p + "/") for p in self.produced):
            return True
        return rel.parts[0] not in OUTPUT_ROOTS and (REPO_ROOT / rel).exists()

    def missing(self, paths: list[str]) -> list[str]:
        return [p for p in paths if not self.exists(p)]

    def map_ports(self, tokens: list[str]) -> list[str]:
        out = []
        for token in tokens:
            for documented, live in self.ports.items():
                token = re.sub(rf"(?<=[:/]){documented}\b", live or documented, token)
            out.append(token)
        return out

    def skipped_port(self, tokens: list[str]) -> str | None:
        return next((p for p, live in self.ports.items() if live is None and any(f":{p}" in t for t in tokens)), None)

    def rewrite_configs(self) -> None:
        """Point the workspace's config files at the live ports (always from the pristine copies)."""
        for path, text in self.originals.items():
            new = text
            for documented, live in self.ports.items():
                new = re.sub(rf"((?:127\.0\.0\.1|localhost):){documented}\b", rf"\g<1>{live or documented}", new)
            if new != path.read_text():
                path.write_text(new)

    def wait_for_services(self) -> None:
        pending, self.pending = self.pending, []
        for cmd, proc, url, log in pending:
            try:
                wait_healthy(url, proc, name=url, timeout_s=120, log=log)
            except RuntimeError as e:  # ServiceStartError: it exited or never answered
                raise AssertionError(f"the service of {cmd.where()} did not start: {e}") from None


def make_workspace(root: Path) -> Workspace:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in COPIED_DIRS:
        shutil.copytree(REPO_ROOT / name, root / name)
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {a} * 7?"}],
             "reward_model": {"style": "rule", "ground_truth": str(a * 7)},
             "extra_info": {"index": i, "tools_kwargs": {"calculator": {"create_kwargs": {"expected": str(a * 7)}}}},
             "agent_name": "tool_agent"} for i, a in enumerate((12, 31, 45))]
    for rel in USER_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), root / rel)
    ws = Workspace(root)
    for name in COPIED_DIRS:
        for path in (root / name).rglob("*"):
            if path.suffix in (".yaml", ".yml", ".json", ".py") and path.is_file():
                ws.originals[path] = path.read_text()
    return ws


def start_service(ws: Workspace, cmd: Command, argv: list[str], health: str) -> None:
    if "--port" not in argv:
        raise AssertionError("a service command must name its --port (later commands reach it there)")
    documented = argv[argv.index("--port") + 1]
    if health == "/v1/ping" and shutil.which("bwrap") is None:
        ws.ports[documented] = None  # the sandbox refuses to start without isolation; commands using it skip
        return
    live = str(free_port())
    ws.ports[documented] = live
    ws.rewrite_configs()
    argv = ws.map_ports(argv)
    argv[argv.index("--port") + 1] = live
    full = agentrl_command(*argv[1:]) if argv[0] == "agentrl" else [sys.executable, *argv[1:]]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(full, cwd=ws.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **cmd.env})
    ws.services.append((proc, log))
    ws.pending.append((cmd, proc, f"http://127.0.0.1:{live}{health}", log))


def run_curl(argv: list[str]) -> None:
    method, headers, data, url = "GET", {}, None, None
    tokens = iter(argv[1:])
    for token in tokens:
        if token == "-X":
            method = next(tokens)
        elif token == "-H":
            key, value = next(tokens).split(":", 1)
            headers[key.strip()] = value.strip()
        elif token == "-d":
            data, method = next(tokens), "POST" if method == "GET" else method
        elif token == "-s":
            continue
        elif token.startswith("http"):
            url = token
        else:
            raise AssertionError(f"curl option {token!r} is not understood by this test")
    response = httpx.request(method, url, headers=headers, content=data, timeout=60)
    assert response.status_code < 300, f"HTTP {response.status_code}: {response.text[:500]}"


def check_training_run(ws: Workspace, argv: list[str]) -> None:
    """A parsed-only `agentrl train` / `sft`: its own `--check` (config, model directory, every data row, rewards,
    the tools the tasks name, logger packages) passes, and its run directory is written: `agentrl train`'s as a
    finished run (`finish_run`), so the page's commands meet each other's run directories as a user's do."""
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig

    code, out, err = call_main([*argv[1:], "--check"])
    # a logger package that an earlier `pip install -e '.[extra]'` of the page installs is not missing
    problems = [line for line in err.splitlines() if line.startswith("error:")
                and not any(f"'.[{extra}]'" in line for extra in ws.extras_installed)]
    if code != 0:
        assert problems == [] and "error:" in err, f"--check fails:\n{(out + err)[-3000:]}"
    if argv[1] == "train":
        finish_run(load_config(TrainConfig, *_config_and_overrides(argv)))
    else:
        from agentrl.trainer.sft import SFTConfig

        ns = parse(argv[1:])
        sft = load_config(SFTConfig, ns.config, ns.overrides).sft
        ws.produced.update([sft.run_dir] + ([sft.output_dir] if sft.output_dir else []))


def _config_and_overrides(argv: list[str]) -> tuple[str, list[str]]:
    ns = parse(argv[1:])
    return ns.config, ns.overrides


def finish_run(cfg) -> None:
    """What a user meets running this `agentrl train` after the page's earlier ones, and what it leaves: the real
    run-dir logic decides how it starts (an earlier run of another config in its run_dir stops it with one line),
    then the run dir is left as a finished run leaves it (config.yaml, a checkpoint, final_model/, COMPLETE)."""
    from agentrl.config import save_config
    from agentrl.errors import UserError
    from agentrl.trainer.checkpoint import CRITIC_RANK_FILE, CRITIC_SHARDS_DIR, begin_checkpoint, commit_checkpoint
    from agentrl.trainer.resume import FINAL_MODEL_DIR, RECORDED_PATHS, mark_complete, plan_start, prepare_run_dir

    try:
        start = plan_start(cfg)
    except UserError as e:
        raise AssertionError(f"after the page's earlier commands it fails: error: {e}") from None
    if start.complete:
        return
    prepare_run_dir(cfg, start)
    steps, run_dir = cfg.trainer.total_steps, Path(cfg.trainer.run_dir)
    tmp = begin_checkpoint(run_dir, steps)
    save_config(cfg, tmp, path_keys=RECORDED_PATHS)
    if cfg.critic.enable:
        (tmp / CRITIC_SHARDS_DIR).mkdir()
        for rank in range(cfg.critic.world_size):
            (tmp / CRITIC_RANK_FILE.format(rank=rank)).touch()
    commit_checkpoint(tmp, steps)
    (run_dir / FINAL_MODEL_DIR).mkdir()
    mark_complete(run_dir, steps)


def declared_outputs(argv: list[str], ns) -> list[str]:
    """What a parsed-only command would write, so later commands may name it."""
    if argv[:2] == ["agentrl", "eval"]:
        return [ns.out or f"runs/eval-{ns.name or Path(ns.model).name}"]
    if argv[:2] == ["agentrl", "export"]:
        return [ns.out]
    if argv[:2] == ["agentrl", "quickstart"] or argv[:2] == ["make", "quickstart"]:
        smoke = getattr(ns, "smoke", False)
        return [getattr(ns, "run_dir", None) or ("runs/quickstart-smoke" if smoke else "runs/quickstart")]
    if argv[:3] == ["agentrl", "engine", "launch-sglang"] and ns.urls_file:
        return [ns.urls_file]
    return []


def check_quickstart_recipe(ns) -> None:
    """A documented quickstart's recipe resolves: its suites, overlays and every --set key are real."""
    from agentrl.quickstart.cli import settings_from_args

    settings_from_args(ns)


def check_parsed_only(ws: Workspace, cmd: Command, argv: list[str]) -> None:
    ns = None
    if argv[0] == "agentrl":
        ns = parse(argv[1:])
        if argv[1] in ("train", "sft"):
            check_training_run(ws, argv)
        if argv[1] == "quickstart":
            check_quickstart_recipe(ns)
    elif argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.M)
        assert argv[1] in targets, f"the Makefile has no target {argv[1]!r}"
        make_args = [a.split("=", 1)[1] for a in argv[2:] if a.startswith("ARGS=")]
        if argv[1] == "quickstart" and make_args:  # the Makefile passes ARGS to agentrl quickstart
            ns = parse(["quickstart", *shlex.split(make_args[0])])
            check_quickstart_recipe(ns)
    elif argv[0] == "bash":
        script = REPO_ROOT / argv[1]
        assert script.is_file(), f"{argv[1]} does not exist"
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        ws.produced.add(cmd.env.get("OUT", f"runs/examples/{script.parent.name}"))
        overrides = [a for a in argv[2:] if "=" in a]
        if overrides:  # the launchers pass extra arguments to `agentrl train CONFIG` as overrides
            config = script.parent / "config.yaml"
            found = re.search(r"^CONFIG=(\S+)", script.read_text(), re.M)
            config = config if config.is_file() else REPO_ROOT / found.group(1)
            run_in_process(["train", str(config), *overrides, "--print-config"])
    elif argv[0] == "pip":
        extras = _optional_dependencies()
        for spec in argv[2:]:
            for extra in re.findall(r"\[([^\]]+)\]", spec):
                missing = [e for e in extra.split(",") if e not in extras]
                assert not missing, f"pyproject.toml has no extra(s) {missing}"
                ws.extras_installed.update(extra.split(","))
    ws.produced.update(declared_outputs(argv, ns))
    missing = ws.missing(named_paths(argv[1:]))
    assert not missing, f"names paths that neither exist nor come from an earlier command: {missing}"


def _optional_dependencies() -> dict:
    import tomllib

    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})


def runs_for_real(argv: list[str]) -> bool:
    if argv[0] != "agentrl":
        return False
    rest = argv[1:]
    return ("--help" in rest or rest == ["--version"] or rest[:1] == ["init-model"] or rest[:2] in
            (["data", "make"], ["data", "demos"], ["tools", "list"])
            or (rest[:1] in (["train"], ["sft"]) and bool({"--print-config", "--check"} & set(rest)))
            or (rest[:2] == ["engine", "launch-sglang"] and "--dry-run" in rest))


def run_command(ws: Workspace, cmd: Command) -> None:
    argv = cmd.argv
    health = next((h for prefix, h in SERVICE_HEALTH.items() if tuple(argv[: len(prefix)]) == prefix), None)
    if health is None and argv[0] == "python" and argv[1:2] and argv[1].endswith(".py") and "--port" in argv:
        health = "/health"  # a script serving tools (examples/custom_tool_service/my_tools.py)
    if health is not None:
        if argv[0] == "agentrl":
            parse(argv[1:])
        start_service(ws, cmd, argv, health)
        return
    ws.wait_for_services()
    if ws.skipped_port(argv):
        return  # it talks to a sandbox that could not start here (no bubblewrap)
    live = ws.map_ports(argv)
    if argv[0] == "curl":
        run_curl(live)
    elif argv[0] == "python" and argv[1:2] and argv[1].endswith(".py"):
        missing = ws.missing([argv[1]])
        assert not missing, f"{argv[1]} does not exist"
        out = subprocess.run([sys.executable, *live[1:]], cwd=ws.root, capture_output=True, text=True, timeout=120,
                             env={**os.environ, **cmd.env})
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    elif runs_for_real(argv):
        before = named_paths(argv[1:])
        missing_before = set(ws.missing(before))
        run_in_process(live[1:])
        still_missing = [] if {"--dry-run", "--help"} & set(argv) else ws.missing(sorted(missing_before))
        assert not still_missing, f"names paths that neither exist nor does it write: {still_missing}"
    elif parsed_only_reason(argv) is not None:
        check_parsed_only(ws, cmd, argv)
    else:
        raise AssertionError("neither run by this test nor listed in PARSED_ONLY (add it there with the reason "
                             "it cannot run here, or make it cheap)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_command_of_the_page_runs_or_parses(page, tmp_path, monkeypatch):
    commands = extract_commands(page)
    ws = make_workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    failures = []
    try:
        for cmd in commands:
            try:
                run_command(ws, cmd)
            except AssertionError as e:
                failures.append(f"{cmd.where()}\n    {str(e).strip()}")
    finally:
        for proc, log in ws.services:
            stop_process_group(proc)
            log.close()
    assert not failures, "\n".join(failures)


def test_the_parsed_only_list_stays_short_and_used():
    used = {prefix for page in PAGES for cmd in extract_commands(page) for prefix in PARSED_ONLY
            if tuple(cmd.argv[: len(prefix)]) == prefix}
    assert set(PARSED_ONLY) == used, f"entries no page uses: {sorted(set(PARSED_ONLY) - used)}"


def test_readme_is_a_guide_that_starts_with_the_two_commands_and_links_every_page():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first = [c.argv for c in extract_commands(REPO_ROOT / "README.md")[:2]]
    assert first == [["make", "quickstart"], ["make", "test"]]
    for doc in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in text, f"README.md does not link docs/{doc.name}"


# A run named by a counter ("session 12", "session-13" in an anchor) cannot be looked up; runs are named by date
# and commit (docs/log.md).
RUN_COUNTER = re.compile(r"\bsessions?[ _-]?\d+", re.I)
LOG_PAGE = REPO_ROOT / "docs" / "log.md"  # the experiment log may be as long as its history


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_pages_are_references_of_bounded_length_that_name_no_run_by_a_counter(page):
    lines = page.read_text().splitlines()
    if page.parent == REPO_ROOT / "docs" and page != LOG_PAGE:
        assert len(lines) <= 300, f"{page.relative_to(REPO_ROOT)} has {len(lines)} lines; history goes to docs/log.md"
    counters = [f"{n}: {line.strip()[:100]}" for n, line in enumerate(lines, start=1) if RUN_COUNTER.search(line)]
    assert not counters, f"{page.relative_to(REPO_ROOT)} names runs by a counter (use the date and commit):\n" + \
        "\n".join(counters)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_links_between_pages_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO_ROOT)}: broken links {broken}"


def test_train_commands_that_share_a_run_dir_fail_as_they_would_for_a_user(tmp_path, monkeypatch):
    """Two documented trainings in one run directory: the second meets the first's finished run and stops."""
    lines = """agentrl init-model runs/tiny-model
agentrl data make calc --split train   --n 20 data/calc-train.jsonl   --seed 0
agentrl data make calc --split heldout --n 20 data/calc-heldout.jsonl --seed 0
agentrl train configs/calc_tiny_cpu.yaml trainer.total_steps=5
agentrl train configs/calc_tiny_cpu.yaml trainer.total_steps=5
agentrl train configs/calc_tiny_cpu.yaml trainer.total_steps=5 'data.train_files=[data/train.parquet]'
agentrl train configs/calc_tiny_cpu.yaml 'data.train_files=[data/train.parquet]'""".splitlines()
    commands = [Command("page.md", n, text, {}, shlex.split(text)) for n, text in enumerate(lines, start=1)]
    ws = make_workspace(tmp_path / "ws")
    monkeypatch.chdir(ws.root)
    for cmd in commands[:5]:  # the same command twice: the second finds the run complete and does nothing
        run_command(ws, cmd)
    with pytest.raises(AssertionError, match=r"error: runs/calc-tiny-cpu holds a run completed at step 5 with "
                                             r"another config \(data.train_files .*\); to train this config, set "
                                             r"another trainer.run_dir"):
        run_command(ws, commands[5])
    with pytest.raises(AssertionError, match=r"error: cannot resume from .*step_000005: the config differs from the "
                                             r"checkpoint's in data.train_files"):
        run_command(ws, commands[6])
