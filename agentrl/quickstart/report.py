"""The quickstart's report.md (held-out tables, what produced the run, time per phase) and curves.png."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from agentrl.config import to_dict
from agentrl.quickstart.recipe import QuickstartConfig
from agentrl.trainer.curve_panels import CURVE_PANELS, REFERENCE_KL, SMOOTHING_WINDOW, moving_average


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



def source_commit(root: Path = Path(__file__).resolve().parents[2]) -> str:
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


def smoke_note(cfg: QuickstartConfig) -> str:
    return (f"**This is a smoke run** (`agentrl quickstart --smoke`): {cfg.sft.sft.max_steps} SFT steps and "
            f"{cfg.train.trainer.total_steps} GRPO steps of {cfg.train.data.train_batch_size} prompts x "
            f"{cfg.train.rollout.n} episodes, evaluated on {cfg.data.heldout_per_suite} held-out tasks per suite, only "
            "check that every phase runs. A model trained this little solves almost no task, so pass@1 at or near 0% "
            "before and after GRPO is expected. Run `agentrl quickstart` without --smoke for a real before/after "
            "comparison.")


def seeds_line(cfg: QuickstartConfig) -> str:
    """Which seed drove what; GRPO's three seeds read as one when they agree (the recipe's rule)."""
    grpo = {"task order": cfg.train.data.seed, "sampling": cfg.train.rollout.seed, "trainer": cfg.train.trainer.seed}
    grpo_text = (f"GRPO seed {cfg.train.trainer.seed} (task order, sampling)" if len(set(grpo.values())) == 1
                 else "GRPO seeds " + ", ".join(f"{seed} ({what})" for what, seed in grpo.items()))
    return (f"- seed: {cfg.seed} (initial weights, data); SFT seed {cfg.sft.sft.seed} (data order)"
            + (f", SFT model reused from {cfg.sft_model}" if cfg.sft_model else "") + f"; {grpo_text}")


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


def report_text(cfg: QuickstartConfig, results: dict[str, dict], timings: dict[str, float], total_s: float,
                commit: str | None = None, kernels: str | None = None, sampled: dict[str, dict] | None = None,
                smoke: bool = False) -> str:
    """report.md: (for a smoke run, first) what its numbers mean, the held-out tables (greedy; with `sampled`,
    also sampled at the rollouts' temperature), the curves, what produced the run (seeds, commit, the resolved
    recipe `cfg`) and the time per phase."""
    from agentrl.console import format_duration
    from agentrl.evaluation.report import markdown_report

    lines = [f"> {smoke_note(cfg)}", ""] if smoke else []
    lines += [markdown_report("agentrl quickstart: held-out results (same greedy sampling for both)", results)]
    if sampled is not None:
        lines += sampled_section(results, sampled, cfg.eval.sampled_n, cfg.train.rollout.temperature)
    lines += ["![curves](curves.png)", "", "## What produced this run", "", seeds_line(cfg),
              f"- CPU kernels: {kernels or 'not recorded'}",
              f"- agentrl commit: {commit or source_commit()}",
              "- settings (the resolved recipe):", "", "```yaml",
              yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip(), "```", "", "## Time per phase", ""]
    lines += [f"- {name}: {format_duration(sec)}" for name, sec in timings.items()]
    lines += [f"- total: {format_duration(total_s)}", ""]
    return "\n".join(lines)
