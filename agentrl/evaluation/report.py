"""Markdown summaries of evaluation results, for one model or two side by side."""

from __future__ import annotations

ROWS = [
    ("pass@1", "pass@1", "{:.1%}"),
    ("mean@n", "mean@n (success rate)", "{:.1%}"),
    ("mean_reward", "mean reward", "{:.3f}"),
    ("avg_turns", "avg turns", "{:.2f}"),
    ("tool_calls_per_episode", "tool calls / episode", "{:.2f}"),
    ("tool_error_rate", "tool error rate", "{:.1%}"),
    ("infra_failed_episodes", "infra-failed episodes", "{}"),
    ("avg_model_tokens", "avg model tokens", "{:.1f}"),
    ("num_tasks", "tasks", "{}"),
]


def _fmt(summary: dict, key: str, pattern: str) -> str:
    if key not in summary:
        return "-"
    return pattern.format(summary[key])


def _pass_keys(*summaries: dict) -> list[str]:
    keys = {k for s in summaries for k in s if k.startswith("pass@") and k != "pass@1"}
    return sorted(keys, key=lambda k: int(k.split("@")[1]))


def summary_table(summaries: dict[str, dict]) -> str:
    """A Markdown table with one column per named summary (e.g. {"after SFT": s1, "after GRPO": s2})."""
    names = list(summaries)
    rows = ROWS[:1] + [(k, k, "{:.1%}") for k in _pass_keys(*summaries.values())] + ROWS[1:]
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label, pattern in rows:
        lines.append(f"| {label} | " + " | ".join(_fmt(summaries[n], key, pattern) for n in names) + " |")
    return "\n".join(lines)


def markdown_report(title: str, summaries: dict[str, dict]) -> str:
    """Overall table plus one table per data source when the suite mixes sources."""
    parts = [f"# {title}", "", summary_table(summaries), ""]
    sources = sorted({src for s in summaries.values() for src in s.get("by_data_source", {})})
    for src in sources:
        per = {name: s.get("by_data_source", {}).get(src, {}) for name, s in summaries.items()}
        parts += [f"## {src}", "", summary_table(per), ""]
    errors = {name: s.get("tool_errors_by_kind", {}) for name, s in summaries.items()}
    if any(errors.values()):
        parts += ["## Tool errors by kind", ""]
        for name, by_kind in errors.items():
            parts.append(f"- {name}: " + (", ".join(f"{k} {v}" for k, v in by_kind.items()) or "none"))
        parts.append("")
    return "\n".join(parts)
