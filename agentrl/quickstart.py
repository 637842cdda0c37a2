"""`agentrl quickstart`: teach a small model to use tools on this CPU, end to end, and show before/after.

From nothing downloaded: build a small model + tokenizer, generate task suites, start the tool service and the
sandbox on loopback, SFT on scripted demonstrations (cold start), evaluate on the held-out split, run GRPO with
tools (embedded engine + Ray FSDP trainer), evaluate again, and write `report.md` + `curves.png`.
Every service is shut down at the end, on errors and on Ctrl-C.

Each run starts clean in its run directory (`runs/quickstart`, `runs/quickstart-smoke` for `--smoke`): an
earlier run there is moved aside to `<run_dir>.old-N`. The report says which settings, seed and agentrl commit
produced it and how long each phase took.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import UserError
from agentrl.trainer.curve_panels import CURVE_PANELS, REFERENCE_KL, SMOOTHING_WINDOW, moving_average


@dataclass
class QuickstartSettings:
    run_dir: str = "runs/quickstart"
    smoke: bool = False  # --smoke: a miniature run (SMOKE) that checks every phase works; its numbers mean nothing
    size: str = "tiny"  # agentrl init-model size: tiny is the fastest to train on a few CPU cores
    init: str = "copy"  # agentrl init-model --init: random weights plus a hand-set in-context copy circuit
    suites: list[str] = field(default_factory=lambda: ["calc", "lookup"])
    heldout_per_suite: int = 200
    # the held-out split is also evaluated sampled at the rollout temperature, this many samples per task (0: not):
    # the success rate GRPO optimises, beside the greedy pass@1 of the headline (docs/quickstart.md#results)
    sampled_eval_n: int = 4
    sft_demos_per_suite: int = 4000
    # per-suite demonstration counts over sft_demos_per_suite for the suites named: a suite's share of the SFT
    # batches. Lookup gets 1,000 (300 of them two-hop): the cold start then mostly stops after the first hop and
    # GRPO teaches the second; with 4,000 it already knows it and GRPO has little left to gain. Calc gets 2,000:
    # a shorter cold start leaves GRPO more to teach on calc too (docs/quickstart.md#results)
    sft_demos: dict[str, int] = field(default_factory=lambda: {"calc": 2000, "lookup": 1000})
    # shares of 1-, 2- and 3-operation problems among the calc demonstrations (None: the train split's 55/35/10%).
    # A fifth are three-operation chains, as in the held-out split, so that every SFT seed's cold start completes
    # some and GRPO has a chain to reinforce (docs/quickstart.md#results)
    sft_calc_op_weights: list[float] | None = field(default_factory=lambda: [0.45, 0.35, 0.2])
    sft_steps: int = 225  # ~1.2 epochs of the 3,000 demonstrations at the batch below: few repeats
    sft_batch_size: int = 16
    sft_lr: float = 2e-3
    grpo_steps: int = 200
    grpo_prompts_per_step: int = 8
    # prompts rolled out per round of dynamic sampling (DAPO's generation batch). At T=0.7 one group in 3-4 carries
    # signal late in a run, so refill rounds follow; 32 prompts a round cost the same per episode and only generate
    # more (docs/quickstart.md#make-quickstart-from-a-fresh-clone-session-13)
    grpo_gen_prompts_per_step: int = 16
    grpo_n: int = 8
    grpo_lr: float = 1e-4
    # rollouts' sampling temperature (the sampled held-out evaluations use it too). 0.7 rather than 1.0: GRPO then
    # reinforces answers near the greedy one, which is what greedy pass@1 measures
    # (docs/quickstart.md#the-current-defaults-rollouts-at-t07-session-12)
    grpo_temperature: float = 0.7
    grpo_mini_batches: int = 2  # optimizer steps per GRPO step (the step's prompts split into this many groups)
    grpo_tasks_per_suite: int = 4000  # a run draws ~5,500 prompts over both suites (refills included): none twice
    # per-suite RL task counts over grpo_tasks_per_suite: the step's prompts are drawn in that ratio. calc : lookup
    # 3 : 2, since lookup's lower success makes more of its groups carry signal (dynamic sampling keeps those)
    grpo_tasks: dict[str, int] = field(default_factory=lambda: {"lookup": 2667})
    grpo_hard_tasks: bool = True  # GRPO prompts from the train split's hard mix (`agentrl data make --hard`)
    # DAPO dynamic sampling: a step trains on groups whose rewards differ, refilled from new prompts (up to this
    # many extra rollout rounds); 0 trains on whatever the first round gave, zero-variance groups included
    grpo_filter_rounds: int = 3
    # code demonstrations try the function with the python tool before answering (False: they answer at once)
    code_test_call: bool = True
    # code demonstrations restate each phrase of the task as a comment above its line (`# keeps the odd numbers`)
    code_comments: bool = False
    max_response_tokens: int = 256
    max_assistant_turns: int = 4
    max_new_tokens_per_turn: int = 128  # one model turn (capped by max_response_tokens)
    max_concurrent_episodes: int = 128  # episodes rolled out at once (GRPO and the held-out evaluations)
    seed: int = 0  # initial weights, data (demos, RL tasks, held-out) and, unless set below, SFT and GRPO
    sft_seed: int | None = None  # SFT data order (None: seed); what another machine's rounding would change
    grpo_seed: int | None = None  # GRPO task order and rollout sampling (None: seed)
    sft_model: str | None = None  # an SFT model from an earlier quickstart with the same seed: skip the SFT phase
    # trainer config overrides for the RL phase, e.g. [algorithm.adv_estimator=rloo] or, for PPO with a critic
    # and GAE, [algorithm.adv_estimator=gae, critic.enable=true]: other algorithms on the same SFT model and budget
    rl_overrides: list[str] = field(default_factory=list)
    # AVX2 kernels for ATen and MKL (agentrl/numerics.py), so that machines of one CPU vendor compute the same
    # floats and train the same SFT model (measured: AMD EPYC hosts with AVX-512 and with AVX2 only, the same SFT
    # loss to 4 digits and 62.5% / 62.5% held-out on both; an Intel Xeon trains another: MKL runs its AVX2
    # branch on Intel CPUs only); false: this CPU's own kernels, another SFT model on each kind of CPU
    pin_kernels: bool = True
    tools_port: int | None = None  # None: a free port
    sandbox_port: int | None = None
    with_sandbox: bool = True


# Defaults of a run on the code suite alone (`--suites code`), applied over the ones above (which are the calc
# and lookup recipe's, measured and documented) and under --smoke and --set. A three-layer model (tiny3) and
# demonstrations that restate each numbered phrase as a comment above its line (code_comments=True): the cold
# start then reads its operators from the phrase beside it (seed 3's missed `+`/`-` at 600 SFT steps, not at
# 1,200, where seed 1 gained less), and what it leaves is length (one demonstration in fifty has three steps,
# against two in five held-out), which GRPO on the hard mix learns. The demonstrations answer at once
# (code_test_call=False; the python tool stays offered): with a python call first, each episode costs two sandbox
# processes and three times the tokens. Rolled out 8 prompts a round (grpo_gen_prompts_per_step=8). What GRPO
# gains, per seed: docs/quickstart.md#the-code-suite.
CODE_DEFAULTS = dict(heldout_per_suite=200, sft_demos_per_suite=2000, sft_steps=600, max_response_tokens=320,
                     max_new_tokens_per_turn=192, max_assistant_turns=3, max_concurrent_episodes=64, grpo_steps=60,
                     code_test_call=False, grpo_gen_prompts_per_step=8, grpo_temperature=1.0, size="tiny3",
                     code_comments=True)
SUITE_DEFAULTS = {("code",): CODE_DEFAULTS}

SMOKE_RUN_DIR = "runs/quickstart-smoke"
SMOKE = dict(smoke=True, size="tiny", heldout_per_suite=8, sft_demos_per_suite=16, sft_steps=4, sft_batch_size=8,
             grpo_steps=2, grpo_prompts_per_step=2, grpo_n=2, grpo_tasks_per_suite=8, max_response_tokens=96,
             max_assistant_turns=3, sampled_eval_n=2, sft_demos={}, grpo_tasks={},
             grpo_filter_rounds=0)  # no filtering: both steps update, whatever the rewards


def _pick_port(requested: int | None, what: str) -> int:
    from agentrl.services import ServiceStartError, free_port, port_is_free

    if requested is None:
        return free_port()
    if not port_is_free(requested):
        raise ServiceStartError(f"{what}: port {requested} on 127.0.0.1 is taken; free it or pass another port "
                                "(or omit the port option to pick a free one)")
    return requested


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


def make_data(s: QuickstartSettings, data_dir: Path, sandbox_url: str | None = None) -> dict:
    """SFT demos, RL training tasks (other seeds than the demos) and the held-out split, per suite. The code
    suite's demonstrations run their python call in the sandbox at `sandbox_url` and their final code must pass
    the task's unit tests there (required for that suite)."""
    from agentrl.data.suites import HARD_MIX_SUITES, make_suite, write_suite
    from agentrl.data.suites.common import write_jsonl
    from agentrl.data.suites.demos import make_demos
    from agentrl.evaluation.run import suite_tasks

    data_dir.mkdir(parents=True, exist_ok=True)
    demo_rows, rl_files = [], []
    for suite in s.suites:
        kb = (data_dir / f"{suite}-sft.kb.jsonl").resolve()
        n_demos = s.sft_demos.get(suite, s.sft_demos_per_suite)
        tasks, kb_rows = make_suite(suite, "train", n_demos, s.seed, kb_path=kb,
                                    calc_op_weights=s.sft_calc_op_weights)
        if kb_rows is not None:
            write_jsonl(kb, kb_rows)
        if suite == "code" and sandbox_url is None:
            raise QuickstartError("the code suite's demonstrations are verified in the sandbox: start it (drop "
                                  "--no-sandbox)")
        demo_rows += asyncio.run(make_demos(tasks, sandbox_url=sandbox_url if suite == "code" else None,
                                            code_test_call=s.code_test_call, code_comments=s.code_comments))
        rl = data_dir / f"{suite}-rl.jsonl"
        write_suite(suite, "train", s.grpo_tasks.get(suite, s.grpo_tasks_per_suite), rl, seed=s.seed + 1,
                    hard=s.grpo_hard_tasks and suite in HARD_MIX_SUITES)
        rl_files.append(str(rl))
    write_jsonl(data_dir / "sft.jsonl", demo_rows)
    heldout = suite_tasks(",".join(s.suites), split="heldout", num_tasks=s.heldout_per_suite, seed=s.seed,
                          out_dir=data_dir / "heldout")
    return {"sft": str(data_dir / "sft.jsonl"), "rl": rl_files, "heldout": heldout}


def agent_config(s: QuickstartSettings):
    from agentrl.agent_loop.config import AgentLoopConfig

    return AgentLoopConfig(max_assistant_turns=s.max_assistant_turns, max_response_tokens=s.max_response_tokens,
                           max_new_tokens_per_turn=min(s.max_new_tokens_per_turn, s.max_response_tokens),
                           max_tool_response_tokens=64, max_parallel_calls=2, episode_timeout_s=300.0)


def reward_config(sandbox_url: str | None):
    """Unit-test rewards (the code suite) run in the quickstart's sandbox, over HTTP; there is no other way."""
    from agentrl.agent_loop.config import RewardConfig

    return RewardConfig(sandbox_url=sandbox_url)


def needs_sandbox(s: QuickstartSettings) -> bool:
    """Whether a suite runs code (the code suite: its python tool and its unit-test rewards)."""
    return "code" in s.suites


def check_sandbox_setting(s: QuickstartSettings) -> None:
    if needs_sandbox(s) and not s.with_sandbox:
        raise QuickstartError("the code suite runs every python call and every unit test in the sandbox, and there is "
                              "no local fallback: drop --no-sandbox")


PER_SUITE_COUNTS = ("sft_demos", "grpo_tasks")


def check_per_suite_counts(s: QuickstartSettings) -> None:
    """`sft_demos` and `grpo_tasks` name suites of this run, each with a count of at least 1."""
    for key in PER_SUITE_COUNTS:
        counts = getattr(s, key)
        if not isinstance(counts, dict) or any(k not in s.suites or type(v) is not int or v < 1
                                               for k, v in counts.items()):
            raise QuickstartError(f"quickstart --set {key}={counts!r}: give a count of at least 1 for suites of "
                                  f"this run ({', '.join(s.suites)}), e.g. {key}={{{s.suites[-1]}: 1000}}")


def engine_config(s: QuickstartSettings):
    from agentrl.inference.config import EngineConfig

    # One intra-op thread: the engine shares 2 cores with the FSDP workers, and oversubscribed torch threads
    # slow CPU decoding by an order of magnitude. One decode slot per concurrent episode.
    return EngineConfig(max_batch_size=s.max_concurrent_episodes, max_model_len=1024, num_threads=1)


def sft_seed(s: QuickstartSettings) -> int:
    return s.seed if s.sft_seed is None else s.sft_seed


def grpo_seed(s: QuickstartSettings) -> int:
    return s.seed if s.grpo_seed is None else s.grpo_seed


def train_config(s: QuickstartSettings, model_path: str, rl_files: list[str], tools_url: str, run_dir: Path,
                 sandbox_url: str | None = None):
    from agentrl.agent_loop.config import RolloutConfig
    from agentrl.tools.config import ServiceConfig, ToolsConfig
    from agentrl.trainer.config import (
        ActorConfig,
        AlgorithmConfig,
        DataConfig,
        ModelConfig,
        TrainConfig,
        TrainerConfig,
    )

    cfg = TrainConfig(
        model=ModelConfig(path=model_path),
        data=DataConfig(train_files=rl_files, train_batch_size=s.grpo_prompts_per_step, seed=grpo_seed(s),
                        gen_batch_size=max(s.grpo_prompts_per_step, s.grpo_gen_prompts_per_step)
                        if s.grpo_filter_rounds > 0 else None),
        engine=engine_config(s),
        tools=ToolsConfig(services=[ServiceConfig(url=tools_url, name="quickstart-tools")]),
        agent=agent_config(s),
        # seeded sampling: each episode's seed derives from grpo_seed and its group (not from the OS entropy pool)
        rollout=RolloutConfig(n=s.grpo_n, temperature=s.grpo_temperature,
                              max_concurrent_episodes=s.max_concurrent_episodes, seed=grpo_seed(s)),
        reward=reward_config(sandbox_url),
        algorithm=AlgorithmConfig(filter_zero_variance_groups=s.grpo_filter_rounds > 0,
                                  max_filter_rounds=max(0, s.grpo_filter_rounds)),
        actor=ActorConfig(lr=s.grpo_lr, weight_decay=0.0,
                          ppo_mini_batch_size=max(1, s.grpo_prompts_per_step // s.grpo_mini_batches),
                          # use_kl_loss with coefficient 0: the KL to the SFT model is measured (actor/kl, drawn in
                          # curves.png) but does not pull on the policy
                          max_tokens_per_micro_batch=16384, use_kl_loss=True, kl_loss_coef=0.0, entropy_coeff=0.0,
                          clip_ratio_high=0.28),
        trainer=TrainerConfig(total_steps=s.grpo_steps, run_dir=str(run_dir), resume="never", seed=grpo_seed(s),
                              test_freq=0, save_freq=0, save_hf_model=True,
                              # every run stops on failing services (the trainer's rules); code runs stop sooner,
                              # at a quarter of a step's episodes lost to the sandbox: never train on less silently
                              max_infra_failed_fraction=0.25 if needs_sandbox(s)
                              else TrainerConfig.model_fields["max_infra_failed_fraction"].default),
    )
    if not s.rl_overrides:
        return cfg
    from agentrl.config import load_config, to_dict

    return load_config(TrainConfig, data=to_dict(cfg), overrides=s.rl_overrides)


def plot_curves(sft_dir: Path, grpo_dir: Path, out: Path, *, heldout: dict[str, float] | None = None,
                window: int = SMOOTHING_WINDOW) -> None:
    """curves.png: every per-step metric as a faint raw line with a `window`-step moving average on top; the
    success panel also marks the held-out figures (`heldout`: label -> fraction; greedy pass@1 after SFT and
    after GRPO, then optionally the same two sampled at the rollouts' temperature); the KL
    panel shows `ppo_kl` (how far one update moved from the policy that sampled the batch) and, when logged,
    `actor/kl` (the KL to the frozen reference model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rows(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    data = {"sft": rows(sft_dir / "sft_metrics.jsonl"), "grpo": [r for r in rows(grpo_dir / "metrics.jsonl")
                                                                 if r.get("step", 0) > 0]}
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))

    def draw(ax, points: list[tuple[int, float]], label: str, color: str) -> None:
        steps, values = zip(*points)
        ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
        ax.plot(steps, moving_average(list(values), window), color=color, linewidth=2,
                label=f"{label} ({window}-step mean)" if len(values) > 1 else label)

    for ax, panel in zip(axes.flat, CURVE_PANELS):
        key, source = panel.key, panel.source
        points = [(r["step"], r[key]) for r in data[source] if key in r]
        if points:
            draw(ax, points, panel.label, "tab:blue")
        else:
            ax.text(0.5, 0.5, f"no '{key}' logged", ha="center", va="center", transform=ax.transAxes)
        if key == "actor/ppo_kl":
            ref = [(r["step"], r[REFERENCE_KL[0]]) for r in data[source] if REFERENCE_KL[0] in r]
            if ref:
                draw(ax, ref, REFERENCE_KL[1], "tab:red")
            else:
                ax.plot([], [], " ", label="actor/kl (to the reference) not logged: actor.use_kl_loss is off")
        if key == "reward/success_rate" and heldout:
            # greedy pass@1 dashed; the sampled success rate (comparable with the train curve) dotted
            styles = [("tab:gray", "--"), ("tab:green", "--"), ("tab:gray", ":"), ("tab:green", ":")]
            for (name, value), (color, style) in zip(heldout.items(), styles):
                ax.axhline(value, color=color, linestyle=style, linewidth=1.5, label=f"held-out {name}: {value:.1%}")
        ax.set_title(panel.title)
        ax.set_xlabel(panel.x_label)
        ax.set_ylabel(panel.unit)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def start_services(s: QuickstartSettings, stack: contextlib.ExitStack, tools_port: int, sandbox_port: int | None,
                   log_dir: Path) -> str | None:
    """Start the tool service (calculator, lookup and, for the code suite, python on the sandbox) and the sandbox
    on loopback, stopped when `stack` closes; returns the sandbox URL (None without one). The code suite needs a
    sandbox that isolates (bubblewrap or docker): one that runs code as plain processes is refused."""
    from agentrl.services import agentrl_command, run_service

    sandbox_url = f"http://127.0.0.1:{sandbox_port}" if sandbox_port is not None else None
    health = None
    if sandbox_url is not None:
        # one interpreter session per episode that calls python: room for every concurrent episode
        sessions = max(32, s.max_concurrent_episodes + 8)
        stack.enter_context(run_service(
            agentrl_command("sandbox", "serve", "--host", "127.0.0.1", "--port", str(sandbox_port),
                            "--set", f"max_sessions={sessions}"),
            f"{sandbox_url}/v1/ping", name="sandbox", log_path=log_dir / "sandbox.log", timeout_s=90))
        import httpx

        health = httpx.get(f"{sandbox_url}/health", timeout=10).json()
        if needs_sandbox(s) and (health.get("unsafe") or "isolation" not in health):
            raise QuickstartError(f"the sandbox at {sandbox_url} does not isolate code (isolation "
                                  f"{health.get('isolation')!r}): the code suite runs only in an isolated sandbox; "
                                  "install bubblewrap (`apt-get install bubblewrap`)")
    tools = ["agentrl.tools.builtin.calculator:calculator", "agentrl.tools.builtin.lookup:lookup"]
    tool_kwargs = []
    if needs_sandbox(s):
        tools.append("agentrl.tools.builtin.python:python")
        tool_kwargs = ["--tool-kwargs", json.dumps({"python": {"sandbox_url": sandbox_url}})]
    tools_url = f"http://127.0.0.1:{tools_port}"
    stack.enter_context(run_service(
        agentrl_command("tools", "serve", *tools, *tool_kwargs, "--host", "127.0.0.1", "--port", str(tools_port)),
        f"{tools_url}/health", name="tool service", log_path=log_dir / "tools.log", timeout_s=90))
    print(f"tools at {tools_url}" + (f", sandbox at {sandbox_url} (isolation: {health.get('isolation')})"
                                     if health else ""), flush=True)
    return sandbox_url


def run_quickstart(s: QuickstartSettings) -> Path:
    """Run every phase; returns the report path."""
    from agentrl.evaluation.run import evaluate
    from agentrl.models.tiny import build_tiny_model
    from agentrl.tools.client import ToolRegistry
    from agentrl.tools.config import ServiceConfig, ToolsConfig
    from agentrl.trainer.loop import FINAL_MODEL_DIR, train
    from agentrl.trainer.config import ActorConfig, ModelConfig
    from agentrl.console import quiet_third_party
    from agentrl.trainer.resume import move_aside
    from agentrl.trainer.sft import SFTConfig, SFTDataConfig, SFTRunConfig, run_sft

    from agentrl.numerics import cpu_kernels, host_cpu

    from agentrl.preflight import check_model_dir

    problems = check_model_dir(s.sft_model, "quickstart --set sft_model") if s.sft_model else []
    if problems:
        raise QuickstartError(f"{problems[0]} (not a model directory: pass the sft/model folder of an earlier "
                              "quickstart run)")
    check_sandbox_setting(s)
    # Ports first: a taken port fails in a second, not after the model and data are built.
    tools_port = _pick_port(s.tools_port, "tool service")
    sandbox_port = _pick_port(s.sandbox_port, "sandbox") if s.with_sandbox else None
    tools_url = f"http://127.0.0.1:{tools_port}"
    quiet_third_party()
    kernels = f"{cpu_kernels()} on {host_cpu()}"  # what is in force, pinned or not, and on which CPU
    root = Path(s.run_dir)
    if root.exists() and any(root.iterdir()):
        print(f"{root} holds an earlier quickstart: moved it to {move_aside(root)}; this run starts clean", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    phase = Phases(total=8)
    started = time.perf_counter()

    with phase(f"build the {s.size} model ({s.init} init) and tokenizer offline"):
        init_dir = build_tiny_model(root / "init-model", size=s.size, seed=s.seed, init=s.init)
    with contextlib.ExitStack() as stack:
        with phase("start the tool service and the sandbox on loopback"):
            sandbox_url = start_services(s, stack, tools_port, sandbox_port, root / "logs")
        with phase(f"generate data ({', '.join(s.suites)}: demos, RL tasks, held-out)"):
            data = make_data(s, root / "data", sandbox_url=sandbox_url)

        if s.sft_model:
            with phase(f"SFT: reuse {s.sft_model}"):
                sft_model = s.sft_model
        else:
            with phase("SFT cold start on scripted demonstrations"):
                sft = run_sft(SFTConfig(
                    model=ModelConfig(path=str(init_dir)),
                    data=SFTDataConfig(train_files=[data["sft"]], max_length=1024),
                    actor=ActorConfig(lr=s.sft_lr, weight_decay=0.0, warmup_steps=10, lr_schedule="cosine",
                                      min_lr_ratio=0.1, max_tokens_per_micro_batch=16384),
                    sft=SFTRunConfig(epochs=100, batch_size=s.sft_batch_size, max_steps=s.sft_steps,
                                     run_dir=str(root / "sft"), seed=sft_seed(s), log_freq=10)))
            sft_model = sft["output_dir"]

        def held_out_eval(model: str, name: str, out: str, n: int = 1, temperature: float = 0.0) -> dict:
            registry = ToolRegistry.from_tools_config(ToolsConfig(services=[ServiceConfig(url=tools_url)]))

            async def go():
                try:
                    return await evaluate(model, data["heldout"], n=n, temperature=temperature,
                                          agent_config=agent_config(s), tools=registry,
                                          engine_config=engine_config(s), reward_config=reward_config(sandbox_url),
                                          max_concurrent_episodes=s.max_concurrent_episodes,
                                          run_dir=root / out, name=name, tasks_source="quickstart held-out")
                finally:
                    await registry.aclose()

            return asyncio.run(go())

        def evaluate_both(model: str, when: str, out: str) -> tuple[dict, dict | None]:
            """Greedy pass@1 (the headline) and, with sampled_eval_n, the success rate sampled at the rollouts'
            temperature with pass@k over those samples."""
            greedy = held_out_eval(model, when, out)
            print(f"held-out pass@1 {when}: {greedy.get('pass@1', 0.0):.1%}", flush=True)
            if not s.sampled_eval_n or sampled_t <= 0:  # greedy rollouts: nothing else to sample
                return greedy, None
            sampled = held_out_eval(model, f"{when}, sampled", f"{out}-sampled", n=s.sampled_eval_n,
                                    temperature=sampled_t)
            print(f"held-out success sampled at T={sampled_t:g} {when}: {sampled.get('mean@n', 0.0):.1%} "
                  f"(pass@{s.sampled_eval_n} {sampled.get(f'pass@{s.sampled_eval_n}', 0.0):.1%})", flush=True)
            return greedy, sampled

        cfg = train_config(s, sft_model, data["rl"], tools_url, root / "grpo", sandbox_url=sandbox_url)
        sampled_t = cfg.rollout.temperature  # the sampled evaluations use the rollouts' temperature
        with phase("evaluate after SFT on the held-out split"):
            before, before_sampled = evaluate_both(sft_model, "after SFT", "eval-sft")
        with phase("GRPO with tools (embedded engine + Ray FSDP trainer)"):
            train(cfg)
        grpo_model = str(root / "grpo" / FINAL_MODEL_DIR)
        with phase("evaluate after GRPO on the held-out split"):
            after, after_sampled = evaluate_both(grpo_model, "after GRPO", "eval-grpo")

    with phase("write the report and curves"):
        sft_dir = Path(sft_model).parent  # <run>/sft/model: the metrics lie beside the model
        # evaluate_both samples both models or neither
        sampled = {"after SFT": before_sampled, "after GRPO": after_sampled} if before_sampled is not None else None
        heldout = {"pass@1 after SFT (greedy)": before.get("pass@1", 0.0),
                   "pass@1 after GRPO (greedy)": after.get("pass@1", 0.0)}
        for when, summary in (sampled or {}).items():
            heldout[f"success {when} (sampled, T={sampled_t:g})"] = summary.get("mean@n", 0.0)
        plot_curves(sft_dir, root / "grpo", root / "curves.png", heldout=heldout)
        report = root / "report.md"
        report.write_text(report_text(s, {"after SFT": before, "after GRPO": after}, phase.timings,
                                      time.perf_counter() - started, kernels=kernels, sampled=sampled,
                                      sampled_temperature=sampled_t))
    delta = after.get("pass@1", 0.0) - before.get("pass@1", 0.0)
    print(f"\nheld-out pass@1: after SFT {before.get('pass@1', 0.0):.1%} -> after GRPO "
          f"{after.get('pass@1', 0.0):.1%} ({delta:+.1%}); report: {report}", flush=True)
    if s.smoke:
        print("this was a smoke run: numbers near 0 are expected (see the report); run `agentrl quickstart` "
              "without --smoke for the real before/after", flush=True)
    return report


def source_commit(root: Path = Path(__file__).resolve().parent.parent) -> str:
    """The git commit of the agentrl source in `root` (the one running), with a note when the tree has
    uncommitted changes; a sentence saying it is unknown outside a git checkout."""
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)

    try:
        top = git("rev-parse", "--show-toplevel")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (git is not available here)"
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return "unknown (agentrl is not running from a git checkout)"
    head = git("rev-parse", "HEAD").stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head + (" with uncommitted changes" if dirty else "")


def smoke_note(s: QuickstartSettings) -> str:
    return (f"**This is a smoke run** (`agentrl quickstart --smoke`): {s.sft_steps} SFT steps and {s.grpo_steps} GRPO "
            f"steps of {s.grpo_prompts_per_step} prompts x {s.grpo_n} episodes, evaluated on {s.heldout_per_suite} "
            "held-out tasks per suite, only check that every phase runs. A model trained this little solves almost "
            "no task, so pass@1 at or near 0% before and after GRPO is expected. Run `agentrl quickstart` without "
            "--smoke for a real before/after comparison.")


def sampled_section(greedy: dict[str, dict], sampled: dict[str, dict], n: int, temperature: float) -> list[str]:
    """report.md's second table: per suite, greedy pass@1 next to the success rate sampled at the rollouts'
    temperature (mean over `n` samples per task) and pass@n, each after SFT -> after GRPO."""
    def cell(before: dict, after: dict, key: str) -> str:
        b, a = before.get(key, 0.0), after.get(key, 0.0)
        return f"{b:.1%} -> {a:.1%} ({(a - b) * 100:+.1f})"

    def per_suite(results: dict) -> dict[str, dict]:
        return {"all suites": results, **results.get("by_data_source", {})}

    gb, ga = per_suite(greedy["after SFT"]), per_suite(greedy["after GRPO"])
    sb, sa = per_suite(sampled["after SFT"]), per_suite(sampled["after GRPO"])
    lines = [f"## Greedy and sampled (T={temperature:g}, {n} samples per task)", "",
             "Greedy pass@1 is the headline above. GRPO optimises the success rate of *sampled* episodes: the "
             "same held-out tasks sampled at the rollouts' temperature show how much the policy improved, and "
             f"pass@{n} how many tasks it solves at all; greedy decoding already takes the most likely answer, "
             "so it gains less where GRPO mostly makes that answer more likely (docs/quickstart.md#results).", "",
             f"| suite | greedy pass@1 | sampled success (mean@{n}) | pass@{n} |", "|---|---|---|---|"]
    for suite in gb:
        if suite in sb and suite in ga and suite in sa:
            lines.append(f"| {suite} | {cell(gb[suite], ga[suite], 'pass@1')} | "
                         f"{cell(sb[suite], sa[suite], 'mean@n')} | {cell(sb[suite], sa[suite], f'pass@{n}')} |")
    return lines + [""]


def report_text(s: QuickstartSettings, results: dict[str, dict], timings: dict[str, float], total_s: float,
                commit: str | None = None, kernels: str | None = None, sampled: dict[str, dict] | None = None,
                sampled_temperature: float = 1.0) -> str:
    """report.md: (for a smoke run, first) what its numbers mean, the held-out tables (greedy; with `sampled`,
    also sampled at the rollouts' temperature), the curves, what produced the run (seed, commit, settings) and
    the time per phase."""
    from agentrl.evaluation.report import markdown_report
    from agentrl.console import format_duration

    lines = [f"> {smoke_note(s)}", ""] if s.smoke else []
    lines += [markdown_report("agentrl quickstart: held-out results (same greedy sampling for both)", results)]
    if sampled is not None:
        lines += sampled_section(results, sampled, s.sampled_eval_n, sampled_temperature)
    lines += ["![curves](curves.png)", "", "## What produced this run", "",
              f"- seed: {s.seed} (initial weights, data); SFT seed {sft_seed(s)} (data order)"
              + (f", SFT model reused from {s.sft_model}" if s.sft_model else "")
              + f"; GRPO seed {grpo_seed(s)} (task order, sampling)",
              f"- CPU kernels: {kernels or 'not recorded'}",
              f"- agentrl commit: {commit or source_commit()}",
              "- settings:", "", "```json", json.dumps(s.__dict__, indent=1), "```", "", "## Time per phase", ""]
    lines += [f"- {name}: {format_duration(sec)}" for name, sec in timings.items()]
    lines += [f"- total: {format_duration(total_s)}", ""]
    return "\n".join(lines)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="end to end on CPU: model, data, services, SFT, eval, GRPO, eval, report")
    p.add_argument("--run-dir", default=None,
                   help=f"where everything goes (default {QuickstartSettings.run_dir}; with --smoke {SMOKE_RUN_DIR}); "
                        "an earlier run there is moved aside")
    p.add_argument("--smoke", action="store_true",
                   help="a minutes-long miniature run (tiny model, few tasks) that checks every phase works")
    p.add_argument("--tools-port", type=int, default=None)
    p.add_argument("--sandbox-port", type=int, default=None)
    p.add_argument("--no-sandbox", action="store_true", help="do not start the sandbox (calc/lookup do not need it)")
    p.add_argument("--suites", default=None, metavar="NAMES",
                   help="comma-separated task suites (default calc,lookup; also: code). `--suites code` alone "
                        "uses the code suite's own defaults (CODE_DEFAULTS), under --smoke and --set")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set grpo_steps=10 sft_steps=200")
    p.set_defaults(func=_main)


OWN_OPTIONS = {"run_dir": "--run-dir DIR", "smoke": "--smoke", "tools_port": "--tools-port PORT",
               "sandbox_port": "--sandbox-port PORT", "with_sandbox": "--no-sandbox"}


def parse_suites(raw) -> list[str]:
    """`--suites calc,lookup` or `--set suites=[code]` as a checked list of suite names."""
    from agentrl.data.suites import SUITES

    names = [n.strip() for n in raw.split(",")] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise QuickstartError(f"quickstart suites: {raw!r} is not a list of suite names (e.g. --suites code)")
    unknown = [n for n in names if n not in SUITES]
    if unknown or len(set(names)) != len(names):
        raise QuickstartError(f"quickstart suites: {raw!r}: choose distinct names among {', '.join(SUITES)}")
    return names


def suite_defaults(suites: list[str]) -> dict:
    """The settings a run on exactly these suites starts from instead of the class defaults (SUITE_DEFAULTS)."""
    return dict(SUITE_DEFAULTS.get(tuple(suites), {}))


class QuickstartError(UserError):
    """A quickstart option or --set value that cannot be used."""


def _setting_value(key: str, raw: str, field):
    """`--set key=raw` as the setting's type: YAML reads `2e-4` as a string (YAML 1.1 floats need a dot), so
    numbers are converted by the declared type; a value that does not convert names the key and the type."""
    import yaml

    kind = {"int": int, "float": float, "str": str}.get(field.type if isinstance(field.type, str) else "")
    try:
        return kind(raw) if kind else yaml.safe_load(raw)
    except ValueError:
        raise QuickstartError(f"quickstart --set: {key}={raw!r} is not a valid {field.type}") from None


def settings_from_args(args: argparse.Namespace) -> QuickstartSettings:
    """The settings of `agentrl quickstart [--suites S] [--smoke] [--set KEY=VALUE ...]`: the class defaults, then
    the suites' own defaults (SUITE_DEFAULTS: `--suites code`), then SMOKE, then --set."""
    import dataclasses
    import difflib

    values = {}
    fields = {f.name: f for f in dataclasses.fields(QuickstartSettings)}
    for item in args.set:
        key, _, raw = item.partition("=")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            raise QuickstartError(f"quickstart --set: unknown setting {key!r}"
                                  + (f"; did you mean {close[0]!r}?" if close else ""))
        if key in OWN_OPTIONS:
            raise QuickstartError(f"quickstart --set: {key} has its own option; use {OWN_OPTIONS[key]}")
        values[key] = _setting_value(key, raw, fields[key])
    if getattr(args, "suites", None) is not None:
        if "suites" in values:
            raise QuickstartError("quickstart: give the suites once, with --suites or with --set suites=...")
        values["suites"] = args.suites
    recipe = QuickstartSettings()
    suites = parse_suites(values.get("suites", recipe.suites))
    values = {**suite_defaults(suites), **(SMOKE if args.smoke else {}), **values, "suites": suites}
    for key in PER_SUITE_COUNTS:  # the recipe's own per-suite counts, for the suites this run has
        if key not in values:
            values[key] = {k: v for k, v in getattr(recipe, key).items() if k in suites}
    run_dir = args.run_dir or (SMOKE_RUN_DIR if args.smoke else recipe.run_dir)
    s = QuickstartSettings(run_dir=run_dir, tools_port=args.tools_port, sandbox_port=args.sandbox_port,
                           with_sandbox=not args.no_sandbox, **values)
    check_sandbox_setting(s)
    check_per_suite_counts(s)
    if s.sft_calc_op_weights is not None:  # make_tasks checks them too; here they fail before any work
        from agentrl.data.suites.calc import check_op_weights

        try:
            check_op_weights(s.sft_calc_op_weights)
        except ValueError as e:
            raise QuickstartError(f"quickstart --set sft_calc_op_weights: {e}") from None
    if not s.grpo_temperature > 0:
        raise QuickstartError(f"quickstart --set grpo_temperature={s.grpo_temperature:g}: must be > 0 (at 0 every "
                              "episode of a group is the same, so no group carries a GRPO signal); e.g. 0.7")
    if s.rl_overrides:  # a bad key fails now, not after the SFT phase
        from agentrl.config import ConfigError

        try:
            train_config(s, "model", ["tasks.jsonl"], "http://127.0.0.1:1", Path(run_dir) / "grpo")
        except (ConfigError, ValueError) as e:
            raise QuickstartError(f"quickstart --set rl_overrides: {e}") from None
    return s


def _main(args: argparse.Namespace) -> int:
    from agentrl.services import ServiceStartError, sigterm_as_interrupt

    s = settings_from_args(args)
    if s.pin_kernels:  # before torch computes anything, here or in the services and Ray workers started below
        from agentrl.numerics import pin_cpu_kernels

        pin_cpu_kernels()
    sigterm_as_interrupt()
    try:
        run_quickstart(s)
    except ServiceStartError as e:
        print(f"quickstart: {e}", file=sys.stderr)
        return 1
    return 0
