"""The viewer's page of an `agentrl eval` output directory: its report and, when `agentrl eval --compare` wrote
one there, the comparison, both as the tables `agentrl eval` prints.

The report is eval.md (made from eval.json with `eval_markdown` when the file is missing); the comparison is
compare.md, the only record of it (the compared evaluation may live elsewhere). Both are cut into blocks the page
renders as HTML: headings, tables, bullet lists and paragraphs (the Markdown `agentrl eval` writes, nothing more).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

COMPARE_MD = "compare.md"  # written by `agentrl eval --compare` into the first model's output directory
PASS_AT_K_PNG = "pass_at_k.png"  # written by `agentrl eval` when some model drew several samples per task
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_blocks(text: str) -> list[dict]:
    """[{"type": "heading", "level", "text"} | {"type": "table", "header", "rows"} | {"type": "list", "items"} |
    {"type": "paragraph", "text"}] in the order of `text`. Inline `code` and **bold** stay in the text."""
    blocks: list[dict] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line:
            i += 1
        elif line.startswith("#"):
            hashes = len(line) - len(line.lstrip("#"))
            blocks.append({"type": "heading", "level": hashes, "text": line[hashes:].strip()})
            i += 1
        elif line.startswith("|"):
            table = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                if not _SEPARATOR.match(lines[i].strip()):
                    table.append(_cells(lines[i]))
                i += 1
            blocks.append({"type": "table", "header": table[0], "rows": table[1:]})
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].strip().startswith("- "):
                items.append(lines[i].strip()[2:])
                i += 1
            blocks.append({"type": "list", "items": items})
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(("#", "|", "- ")):
                para.append(lines[i].strip())
                i += 1
            blocks.append({"type": "paragraph", "text": " ".join(para)})
    return blocks


def eval_page(run_dir: Path) -> dict:
    """What the page shows of the evaluation in `run_dir` (eval.json must exist)."""
    from agentrl.evaluation.run import EVAL_JSON, EVAL_MD, eval_markdown

    record = json.loads((run_dir / EVAL_JSON).read_text())
    report = run_dir / EVAL_MD
    compare = run_dir / COMPARE_MD
    return {"name": record["name"], "model": record["model"],
            "report": markdown_blocks(report.read_text() if report.is_file() else eval_markdown(record)),
            "compare": markdown_blocks(compare.read_text()) if compare.is_file() else None,
            "pass_at_k": (run_dir / PASS_AT_K_PNG).is_file()}


__all__ = ["COMPARE_MD", "PASS_AT_K_PNG", "eval_page", "markdown_blocks"]
