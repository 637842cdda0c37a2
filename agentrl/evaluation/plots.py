"""pass@k curves from eval.json records: k = 1..n for each model, so two checkpoints can be compared at every k.

The classic reading: RL often lifts pass@1 while pass@k at large k stays flat or drops (it sharpens the
distribution rather than adding solutions); SFT on new skills lifts the whole curve.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.evaluation.metrics import pass_at_k


def pass_at_k_curve(record: dict) -> list[tuple[int, float]]:
    """[(k, mean unbiased pass@k over tasks with >= k valid samples)] for k = 1..n of one eval.json record."""
    n = record["settings"]["n"]
    curve = []
    for k in range(1, n + 1):
        scores = [pass_at_k(t["valid"], t["correct"], k) for t in record["tasks"] if t["valid"] >= k]
        if scores:
            curve.append((k, sum(scores) / len(scores)))
    return curve


def plot_pass_at_k(records: dict[str, dict], out: str | Path) -> Path:
    """Write a PNG with one pass@k curve per named record (log-2 k axis); returns the path."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    try:
        for name, record in records.items():
            curve = pass_at_k_curve(record)
            if curve:
                ax.plot([k for k, _ in curve], [p for _, p in curve], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))  # 1 2 4 8, not 2^0 2^1 ...
        ax.set_xlabel("k (samples)")
        ax.set_ylabel("pass@k")
        ax.set_ylim(0.0, 1.03)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title("pass@k (unbiased estimator)")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out


__all__ = ["pass_at_k_curve", "plot_pass_at_k"]
