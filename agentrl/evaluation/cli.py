"""`agentrl eval`: held-out evaluation of a model on a suite, optionally side by side with a second model.

    agentrl eval --model runs/quickstart/grpo/final_model --suite calc --n 4   # 200 generated held-out tasks
    agentrl eval --model runs/tiny-model --suite data/my-tasks.jsonl --out runs/eval-tiny
    agentrl eval --model runs/after-grpo --suite calc --compare runs/after-sft          # a model or an eval dir
    agentrl eval --model runs/eval-a --compare runs/eval-b                   # two finished evaluations, no rollout

Tools: by default the suite's built-in tools run inside the eval process, the same code a tool service runs,
without sockets (calculator, lookup; the code suite's python tool sends its code to the sandbox given by
`--sandbox-url`, which also runs the unit-test rewards). `--serve-tools` starts them as a real HTTP tool service
(`agentrl tools serve` on a free loopback port) for the length of the run, so every call goes over HTTP exactly
as in training; `--tools-config FILE` uses tool services you run yourself (configs/tools/services.yaml).
Engine, agent-loop budgets, rewards and tools can also come from a training config (`--config`, same keys, plus
`-o key=value` overrides), so a model is evaluated under the budgets it was trained with; with `--serve-tools`
the config's tools are replaced by the served built-ins (a finished run's `config.yaml` names tool services that
stopped with the run).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Iterator

from agentrl.errors import UserError


def _is_eval_dir(path: Path) -> bool:
    return (path / "eval.json").is_file() and not (path / "config.json").is_file()


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


@contextlib.contextmanager
def serve_builtin_tools(names: list[str], *, tool_kwargs: dict[str, dict] | None = None,
                        startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Run the built-in tools `names` as an HTTP tool service in a child process; yields its base URL.

    The child is `agentrl tools serve` (with `tool_kwargs` as its session defaults, e.g. the python tool's
    sandbox) in its own process group on a free loopback port; the whole group is terminated on exit (killed if
    it does not stop within 10 s).
    """
    import json

    from agentrl.services import agentrl_command, free_port, run_service
    from agentrl.tools.builtin import BUILTIN

    unknown = [n for n in names if n not in BUILTIN]
    if unknown or not names:
        raise ValueError(f"serve_builtin_tools: {unknown or 'no tools'} given; built-in tools: {', '.join(BUILTIN)}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = agentrl_command("tools", "serve", *(BUILTIN[n] for n in names),
                          "--host", "127.0.0.1", "--port", str(port))
    if tool_kwargs:
        cmd += ["--tool-kwargs", json.dumps(tool_kwargs)]
    with run_service(cmd, f"{url}/health", name=f"the tool service ({' '.join(cmd[3:])})",
                     timeout_s=startup_timeout_s):
        yield url


def _load_config(args: argparse.Namespace):
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig

    cfg = load_config(TrainConfig, args.config, args.override)
    if args.sandbox_url:
        cfg.reward.sandbox_url = args.sandbox_url
    if args.serve_tools:  # the served built-ins replace the config's tools (a finished run's stopped services)
        from agentrl.tools.config import ToolsConfig

        cfg.tools = ToolsConfig()
    return cfg


def _tool_names(tasks) -> list[str]:
    return sorted({name for task in tasks for name in (task.tools or [])})


@contextlib.contextmanager
def _tools(args: argparse.Namespace, cfg, tasks) -> Iterator[object]:
    """The ToolRegistry for the run (None: `evaluate` builds the in-process built-ins itself)."""
    from agentrl.evaluation.run import builtin_tools_kwargs
    from agentrl.tools.client import ToolRegistry
    from agentrl.tools.config import ServiceConfig, ToolsConfig

    if args.tools_config:
        yield ToolRegistry.from_config(args.tools_config)
    elif _configured_tools(cfg):
        yield ToolRegistry.from_tools_config(cfg.tools)
    elif args.serve_tools and _tool_names(tasks):
        names = _tool_names(tasks)
        kwargs = builtin_tools_kwargs(names, cfg.reward.sandbox_url, cfg.reward.sandbox_token_file)
        with serve_builtin_tools(names, tool_kwargs=kwargs) as url:
            print(f"tool service for {', '.join(names)} on {url}", file=sys.stderr, flush=True)
            yield ToolRegistry.from_tools_config(ToolsConfig(services=[ServiceConfig(url=url, name="eval-tools")]))
    else:
        yield None


def _evaluate_model(args: argparse.Namespace, cfg, tasks, model: Path, out: Path, name: str | None) -> dict:
    import asyncio

    from agentrl.evaluation.run import evaluate, load_eval

    async def run(registry) -> None:
        try:
            await evaluate(model, tasks, n=args.n, ks=args.k, temperature=args.temperature, top_p=cfg.rollout.top_p,
                           top_k=cfg.rollout.top_k, seed=args.seed, engine_config=cfg.engine, agent_config=cfg.agent,
                           reward_config=cfg.reward, tools=registry,
                           max_concurrent_episodes=cfg.rollout.max_concurrent_episodes,
                           success_threshold=args.success_threshold, run_dir=out, name=name,
                           tasks_source=_tasks_source(args))
        finally:
            if registry is not None:
                await registry.aclose()

    print(f"evaluating {model} on {len(tasks)} tasks x {args.n} samples -> {out}", file=sys.stderr, flush=True)
    with _tools(args, cfg, tasks) as registry:
        asyncio.run(run(registry))
    return load_eval(out)


def _is_task_file(spec: str) -> bool:
    return Path(spec).suffix in (".jsonl", ".json", ".parquet") or Path(spec).is_file()


def _tasks_source(args: argparse.Namespace) -> str:
    if _is_task_file(args.suite):
        return args.suite
    return f"suite {args.suite}, split {args.split}, {args.num_tasks} tasks per suite, seed {args.suite_seed}"


class EvalArgumentError(UserError):
    """An `agentrl eval` argument names nothing usable (a missing model, an unknown suite, a missing --suite)."""


def _tasks(args: argparse.Namespace, out_dir: Path) -> list:
    """The tasks to evaluate; every bad row of a task file, or an unknown suite name, fails with one line each."""
    from agentrl.evaluation.run import suite_tasks
    from agentrl.preflight import raise_problems, read_task_files

    if _is_task_file(args.suite):
        raise_problems(read_task_files([args.suite], "--suite")[1])
    try:
        return suite_tasks(args.suite, split=args.split, num_tasks=args.num_tasks, seed=args.suite_seed,
                           out_dir=out_dir)
    except ValueError as e:  # neither a task file nor suite names (suite_tasks says which)
        raise EvalArgumentError(str(e)) from None


def _configured_tools(cfg) -> bool:
    return bool(cfg.tools.config or cfg.tools.services or cfg.tools.builtin or cfg.tools.functions)


def _check_rollout(args: argparse.Namespace, cfg, tasks: list, models: list[tuple[str, Path]]) -> None:
    """What a rollout needs, checked before any model loads: model dirs, sampling settings, reward specs and
    the tools the tasks name (tool services are asked for their tool lists). Raises PreflightError."""
    import asyncio

    from agentrl.evaluation.run import default_tools, resolve_temperature
    from agentrl.preflight import (
        TaskRows,
        check_model_dir,
        check_rewards,
        check_task_tools,
        raise_problems,
        served_tools,
    )

    problems = [line for what, path in models for line in check_model_dir(str(path), what)]
    try:
        resolve_temperature(args.temperature, args.n)
    except ValueError as e:
        problems.append(f"--temperature: {e}")
    too_big = [k for k in args.k or [] if k > args.n]
    if too_big:
        problems.append(f"--k {' '.join(map(str, too_big))}: pass@k needs k <= --n ({args.n} samples per task)")
    files = [TaskRows(_tasks_source(args), list(enumerate(tasks, start=1)))]
    problems += check_rewards(files, cfg.reward, sandbox_key="reward.sandbox_url (--sandbox-url)")
    if args.tools_config or _configured_tools(cfg):
        served, tool_problems = served_tools(args.tools_config or cfg.tools,
                                             "--tools-config" if args.tools_config else "tools")
        problems += tool_problems
        if served is not None:
            problems += check_task_tools(files, served)
    else:  # the tasks' built-in tools, in-process or served by --serve-tools
        try:
            registry = default_tools(tasks, sandbox_url=cfg.reward.sandbox_url,
                                     sandbox_token_file=cfg.reward.sandbox_token_file)
        except ValueError as e:  # a tool that is not built in, tools: null, python without a sandbox
            problems.append(str(e))
        else:
            if registry is not None:
                asyncio.run(registry.aclose())
    raise_problems(problems)


def _run_eval(args: argparse.Namespace) -> int:
    from agentrl.evaluation.run import EVAL_MD, compare_markdown, load_eval, model_label, unique_names
    from agentrl.preflight import check_output_path
    from agentrl.trainer.export import is_checkpoint_dir, resolve_model_dir

    model = Path(args.model)
    compare = Path(args.compare) if args.compare else None
    # a training checkpoint is evaluated as the model directory it exports to
    model, compare = (resolve_model_dir(p) if p is not None and is_checkpoint_dir(p) else p for p in (model, compare))
    for what, path in (("--model", model), ("--compare", compare)):
        if path is None or _is_model_dir(path) or _is_eval_dir(path):
            continue
        if not path.exists():
            raise EvalArgumentError(f"{what} {path} does not exist; pass a model directory (e.g. a run's "
                                    "final_model, or one built with `agentrl init-model`) or a finished evaluation")
        raise EvalArgumentError(f"{what} {path}: neither a model directory (config.json) nor a finished evaluation "
                                "(eval.json); build a model with `agentrl init-model` or run `agentrl eval` first")
    if _is_eval_dir(model) and compare is None:
        raise EvalArgumentError(f"--model {model} is a finished evaluation: add --compare RUN_DIR_OR_MODEL, or pass "
                                "a model")
    needs_rollout = _is_model_dir(model) or (compare is not None and _is_model_dir(compare))
    if needs_rollout and not args.suite:
        raise EvalArgumentError("--suite NAME|FILE.jsonl is required to evaluate a model (e.g. --suite calc)")

    name = args.name or model_label(model)
    out = Path(args.out) if args.out else (model if _is_eval_dir(model) else Path("runs") / f"eval-{name}")
    compare_label = args.compare_name or (model_label(compare) if compare is not None else "")
    compare_out = out / f"compare-{compare_label.replace('/', '-')}"
    check_output_path(out, "--out", directory=True)
    cfg = tasks = None
    if needs_rollout:
        cfg = _load_config(args)
        # generated tasks are written beside the first model's results (never into a finished evaluation's dir)
        tasks = _tasks(args, out if _is_model_dir(model) else compare_out)
        _check_rollout(args, cfg, tasks, [(what, path) for what, path in (("--model", model), ("--compare", compare))
                                          if path is not None and _is_model_dir(path)])

    first = _evaluate_model(args, cfg, tasks, model, out, args.name) if _is_model_dir(model) else load_eval(model)
    if args.name:
        first["name"] = args.name
    if compare is None:
        print((out / EVAL_MD).read_text())
        note = _curves({first["name"]: first}, out)
        print(f"wrote {out / 'eval.json'} and {out / EVAL_MD}{note}", file=sys.stderr)
        return 0
    if _is_model_dir(compare):
        second = _evaluate_model(args, cfg, tasks, compare, compare_out, args.compare_name)
    else:
        second = load_eval(compare)
    if args.compare_name:
        second["name"] = args.compare_name
    report = compare_markdown([first, second])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(report)
    print(report)
    names = unique_names([first["name"], second["name"]])
    print(f"wrote {out / 'compare.md'}" + _curves(dict(zip(names, (first, second))), out), file=sys.stderr)
    return 0


def _curves(records: dict[str, dict], out: Path) -> str:
    """Write out/pass_at_k.png when some run drew several samples per task; returns a note for the log."""
    from agentrl.evaluation.plots import plot_pass_at_k

    if all(r["settings"]["n"] == 1 for r in records.values()):
        return ""
    return f" and {plot_pass_at_k(records, out / 'pass_at_k.png')}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("eval", help="evaluate a model on held-out tasks (pass@k, tool use, errors); "
                                           "compare two models")
    p.add_argument("--model", required=True,
                   help="HF model directory, a training checkpoint (run_dir/checkpoints/step_N, exported once "
                        "into it), or a finished evaluation directory (with --compare)")
    p.add_argument("--suite", default=None,
                   help="suite name(s) generated in code (calc, lookup, code, guess; comma-separated) or a task file "
                        "(.jsonl/.parquet)")
    p.add_argument("--split", default="heldout", choices=("heldout", "train"), help="split of generated suites")
    p.add_argument("--num-tasks", type=_positive_int, default=200, help="tasks per generated suite")
    p.add_argument("--suite-seed", type=int, default=0, help="seed of generated suites")
    p.add_argument("--n", type=_positive_int, default=1, help="samples per task")
    p.add_argument("--k", type=_positive_int, nargs="+", default=None,
                   help="pass@k values (default: 1, powers of two below n, n)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0 = greedy for n=1, 1.0 for n>1)")
    p.add_argument("--seed", type=int, default=0, help="base sampling seed")
    p.add_argument("--success-threshold", type=float, default=1.0, help="reward at which an episode counts as solved")
    p.add_argument("--config", default=None,
                   help="a training config YAML: its engine, agent, reward, tools and rollout.top_p/top_k/"
                        "max_concurrent_episodes are used")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted config override, e.g. -o agent.max_assistant_turns=4 -o engine.max_batch_size=64")
    tools = p.add_mutually_exclusive_group()
    tools.add_argument("--tools-config", default=None, help="tools YAML of running tool services (HTTP/MCP)")
    tools.add_argument("--serve-tools", action="store_true",
                       help="serve the suite's built-in tools over HTTP in a child process during the run "
                            "(instead of the tools of --config)")
    p.add_argument("--sandbox-url", default=None, help="sandbox for unit-test rewards (code suite)")
    p.add_argument("--out", default=None, help="run directory (default runs/eval-NAME)")
    p.add_argument("--name", default=None, help="column name of this model (default: its directory name)")
    p.add_argument("--compare", default=None, metavar="RUN_DIR_OR_MODEL",
                   help="a second model (evaluated with the same tasks and settings) or a finished evaluation; "
                        "writes compare.md with both side by side")
    p.add_argument("--compare-name", default=None, help="column name of the compared model")
    p.set_defaults(func=_run_eval)
