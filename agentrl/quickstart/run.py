"""The quickstart's driver: model -> services -> data -> SFT -> evaluation -> GRPO -> evaluation -> report.

Every setting comes from the recipe (`QuickstartConfig`); this file only fills in what exists at run time (paths
in the run directory, the services' URLs) and calls each phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from agentrl.config import load_config, to_dict
from agentrl.quickstart.recipe import QuickstartConfig, QuickstartDataConfig, QuickstartError, needs_sandbox
from agentrl.quickstart.report import plot_curves, report_text


class Phases:
    """Times each phase and prints one line when it starts and ends."""

    def __init__(self, total: int):
        self.total, self.index, self.timings = total, 0, {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.index += 1
        print(f"\n[{self.index}/{self.total}] {name} ...", flush=True)
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start
        print(f"[{self.index}/{self.total}] {name}: done in {self.timings[name]:.0f}s", flush=True)


def pick_port(requested: int | None, what: str) -> int:
    from agentrl.services import ServiceStartError, free_port, port_is_free

    if requested is None:
        return free_port()
    if not port_is_free(requested):
        raise ServiceStartError(f"{what}: port {requested} on 127.0.0.1 is taken; free it or pass another port "
                                "(or omit the port option to pick a free one)")
    return requested


def filled(cfg, values: dict):
    """`cfg` (a config) with the dotted `values` filled in, checked again as its class."""
    tree = to_dict(cfg)
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node[part]
        node[leaf] = value
    return load_config(type(cfg), data=tree)


def make_data(data: QuickstartDataConfig, seed: int, data_dir: Path, sandbox_url: str | None = None) -> dict:
    """SFT demos, GRPO tasks (other seeds than the demos) and the held-out split, per suite. The code suite's
    demonstrations run their python call in the sandbox at `sandbox_url` and their final code must pass the
    task's unit tests there (required for that suite)."""
    from agentrl.data.suites import HARD_MIX_SUITES, make_suite, write_suite
    from agentrl.data.suites.common import write_jsonl
    from agentrl.data.suites.demos import make_demos
    from agentrl.evaluation.run import suite_tasks

    data_dir.mkdir(parents=True, exist_ok=True)
    demo_rows, rl_files = [], []
    for suite in data.suites:
        kb = (data_dir / f"{suite}-sft.kb.jsonl").resolve()
        tasks, kb_rows = make_suite(suite, "train", data.demos[suite], seed, kb_path=kb,
                                    calc_op_weights=data.calc_op_weights)
        if kb_rows is not None:
            write_jsonl(kb, kb_rows)
        if suite == "code" and sandbox_url is None:
            raise QuickstartError("the code suite's demonstrations are verified in the sandbox: start it (drop "
                                  "--no-sandbox)")
        demo_rows += asyncio.run(make_demos(tasks, sandbox_url=sandbox_url if suite == "code" else None,
                                            code_test_call=data.code_test_call, code_comments=data.code_comments))
        rl = data_dir / f"{suite}-rl.jsonl"
        write_suite(suite, "train", data.rl_tasks[suite], rl, seed=seed + 1,
                    hard=data.hard_rl_tasks and suite in HARD_MIX_SUITES)
        rl_files.append(str(rl))
    write_jsonl(data_dir / "sft.jsonl", demo_rows)
    heldout = suite_tasks(",".join(data.suites), split="heldout", num_tasks=data.heldout_per_suite, seed=seed,
                          out_dir=data_dir / "heldout")
    return {"sft": str(data_dir / "sft.jsonl"), "rl": rl_files, "heldout": heldout}


def start_services(suites: list[str], sessions: int, stack: contextlib.ExitStack, tools_port: int,
                   sandbox_port: int | None, log_dir: Path) -> str | None:
    """Start the tool service (calculator, lookup and, for the code suite, python on the sandbox) and the sandbox
    with room for `sessions` interpreter sessions on loopback, stopped when `stack` closes; returns the sandbox URL
    (None without one). The code suite needs a sandbox that isolates (bubblewrap or docker)."""
    from agentrl.services import agentrl_command, run_service

    sandbox_url = f"http://127.0.0.1:{sandbox_port}" if sandbox_port is not None else None
    health = None
    if sandbox_url is not None:
        stack.enter_context(run_service(
            agentrl_command("sandbox", "serve", "--host", "127.0.0.1", "--port", str(sandbox_port),
                            "--set", f"max_sessions={sessions}"),
            f"{sandbox_url}/v1/ping", name="sandbox", log_path=log_dir / "sandbox.log", timeout_s=90))
        import httpx

        health = httpx.get(f"{sandbox_url}/health", timeout=10).json()
        if needs_sandbox(suites) and (health.get("unsafe") or "isolation" not in health):
            raise QuickstartError(f"the sandbox at {sandbox_url} does not isolate code (isolation "
                                  f"{health.get('isolation')!r}): the code suite runs only in an isolated sandbox; "
                                  "install bubblewrap (`apt-get install bubblewrap`)")
    tools = ["agentrl.tools.builtin.calculator:calculator", "agentrl.tools.builtin.lookup:lookup"]
    tool_kwargs = []
    if needs_sandbox(suites):
        tools.append("agentrl.tools.builtin.python:python")
        tool_kwargs = ["--tool-kwargs", json.dumps({"python": {"sandbox_url": sandbox_url}})]
    tools_url = f"http://127.0.0.1:{tools_port}"
    stack.enter_context(run_service(
        agentrl_command("tools", "serve", *tools, *tool_kwargs, "--host", "127.0.0.1", "--port", str(tools_port)),
        f"{tools_url}/health", name="tool service", log_path=log_dir / "tools.log", timeout_s=90))
    print(f"tools at {tools_url}" + (f", sandbox at {sandbox_url} (isolation: {health.get('isolation')})"
                                     if health else ""), flush=True)
    return sandbox_url


def held_out_eval(model: str, tasks: list, train, out: Path, name: str, n: int = 1,
                  temperature: float = 0.0) -> dict:
    """One held-out evaluation with GRPO's agent, engine, rewards and tool service (`train`, a TrainConfig)."""
    from agentrl.evaluation.run import evaluate
    from agentrl.tools.client import ToolRegistry

    registry = ToolRegistry.from_tools_config(train.tools)

    async def go():
        try:
            return await evaluate(model, tasks, n=n, temperature=temperature, agent_config=train.agent,
                                  tools=registry, engine_config=train.engine, reward_config=train.reward,
                                  max_concurrent_episodes=train.rollout.max_concurrent_episodes, run_dir=out,
                                  name=name, tasks_source="quickstart held-out")
        finally:
            await registry.aclose()

    return asyncio.run(go())


def run_quickstart(cfg: QuickstartConfig, run_dir: str | Path, *, tools_port: int | None = None,
                   sandbox_port: int | None = None, with_sandbox: bool = True, smoke: bool = False) -> Path:
    """Run every phase in `run_dir` (an earlier run there is moved aside); returns the report path."""
    from agentrl.console import quiet_third_party
    from agentrl.models.tiny import build_tiny_model
    from agentrl.numerics import cpu_kernels, host_cpu
    from agentrl.preflight import check_model_dir
    from agentrl.trainer.loop import FINAL_MODEL_DIR, train
    from agentrl.trainer.resume import move_aside
    from agentrl.trainer.sft import run_sft

    problems = check_model_dir(cfg.sft_model, "quickstart --set sft_model") if cfg.sft_model else []
    if problems:
        raise QuickstartError(f"{problems[0]} (not a model directory: pass the sft/model folder of an earlier "
                              "quickstart run)")
    suites = cfg.data.suites
    if needs_sandbox(suites) and not with_sandbox:
        raise QuickstartError("the code suite runs every python call and every unit test in the sandbox, and there is "
                              "no local fallback: drop --no-sandbox")
    # Ports first: a taken port fails in a second, not after the model and data are built.
    tools_port = pick_port(tools_port, "tool service")
    sandbox_port = pick_port(sandbox_port, "sandbox") if with_sandbox else None
    quiet_third_party()
    kernels = f"{cpu_kernels()} on {host_cpu()}"  # what is in force, pinned or not, and on which CPU
    root = Path(run_dir)
    if root.exists() and any(root.iterdir()):
        print(f"{root} holds an earlier quickstart: moved it to {move_aside(root)}; this run starts clean", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    phase = Phases(total=8)
    started = time.perf_counter()

    with phase(f"build the {cfg.model.size} model ({cfg.model.init} init) and tokenizer offline"):
        init_dir = build_tiny_model(root / "init-model", size=cfg.model.size, seed=cfg.seed, init=cfg.model.init)
    with contextlib.ExitStack() as stack:
        with phase("start the tool service and the sandbox on loopback"):
            # one interpreter session per concurrent episode that calls python, and a few to spare
            sessions = max(32, cfg.train.rollout.max_concurrent_episodes + 8)
            sandbox_url = start_services(suites, sessions, stack, tools_port, sandbox_port, root / "logs")
        with phase(f"generate data ({', '.join(suites)}: demos, RL tasks, held-out)"):
            data = make_data(cfg.data, cfg.seed, root / "data", sandbox_url=sandbox_url)

        sft_cfg = filled(cfg.sft, {"model.path": str(init_dir), "data.train_files": [data["sft"]],
                                   "sft.run_dir": str(root / "sft")})
        if cfg.sft_model:
            with phase(f"SFT: reuse {cfg.sft_model}"):
                sft_model = cfg.sft_model
        else:
            with phase("SFT cold start on scripted demonstrations"):
                sft_model = run_sft(sft_cfg)["output_dir"]
        train_cfg = filled(cfg.train, {
            "model.path": sft_model, "data.train_files": data["rl"], "trainer.run_dir": str(root / "grpo"),
            "tools.services": [{"url": f"http://127.0.0.1:{tools_port}", "name": "quickstart-tools"}],
            "reward.sandbox_url": sandbox_url})
        temperature, n = train_cfg.rollout.temperature, cfg.eval.sampled_n

        def evaluate_both(model: str, when: str, out: str) -> tuple[dict, dict | None]:
            """Greedy pass@1 (the headline) and, with eval.sampled_n, the success rate sampled at the rollouts'
            temperature with pass@k over those samples."""
            greedy = held_out_eval(model, data["heldout"], train_cfg, root / out, when)
            print(f"held-out pass@1 {when}: {greedy.get('pass@1', 0.0):.1%}", flush=True)
            if not n:
                return greedy, None
            sampled = held_out_eval(model, data["heldout"], train_cfg, root / f"{out}-sampled", f"{when}, sampled",
                                    n=n, temperature=temperature)
            print(f"held-out success sampled at T={temperature:g} {when}: {sampled.get('mean@n', 0.0):.1%} "
                  f"(pass@{n} {sampled.get(f'pass@{n}', 0.0):.1%})", flush=True)
            return greedy, sampled

        with phase("evaluate after SFT on the held-out split"):
            before, before_sampled = evaluate_both(sft_model, "after SFT", "eval-sft")
        with phase("GRPO with tools (embedded engine + Ray FSDP trainer)"):
            train(train_cfg)
        with phase("evaluate after GRPO on the held-out split"):
            after, after_sampled = evaluate_both(str(root / "grpo" / FINAL_MODEL_DIR), "after GRPO", "eval-grpo")

    with phase("write the report and curves"):
        sampled = {"after SFT": before_sampled, "after GRPO": after_sampled} if n else None
        heldout = {"pass@1 after SFT (greedy)": before.get("pass@1", 0.0),
                   "pass@1 after GRPO (greedy)": after.get("pass@1", 0.0)}
        for when, summary in (sampled or {}).items():
            heldout[f"success {when} (sampled, T={temperature:g})"] = summary.get("mean@n", 0.0)
        plot_curves(Path(sft_model).parent, root / "grpo", root / "curves.png", heldout=heldout)
        ran = load_config(QuickstartConfig, data={**to_dict(cfg), "sft": to_dict(sft_cfg), "train": to_dict(train_cfg)})
        report = root / "report.md"
        report.write_text(report_text(ran, {"after SFT": before, "after GRPO": after}, phase.timings,
                                      time.perf_counter() - started, kernels=kernels, sampled=sampled, smoke=smoke))
    delta = after.get("pass@1", 0.0) - before.get("pass@1", 0.0)
    print(f"\nheld-out pass@1: after SFT {before.get('pass@1', 0.0):.1%} -> after GRPO "
          f"{after.get('pass@1', 0.0):.1%} ({delta:+.1%}); report: {report}", flush=True)
    if smoke:
        print("this was a smoke run: numbers near 0 are expected (see the report); run `agentrl quickstart` "
              "without --smoke for the real before/after", flush=True)
    return report
