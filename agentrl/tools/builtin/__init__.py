"""Built-in tools: `calculator` (safe arithmetic), `lookup` (JSONL knowledge base), `python` (sandbox session).

Each is a `@tool`: usable in-process (`ToolRegistry.from_functions([calculator])`, or `builtin: [calculator]`
in a tools config) and servable (`agentrl tools serve agentrl.tools.builtin.calculator:calculator`).
"""

from __future__ import annotations

import importlib

from agentrl.tools.base import Tool

# name -> "module:attribute"; explicit, no discovery.
BUILTIN: dict[str, str] = {
    "calculator": "agentrl.tools.builtin.calculator:calculator",
    "lookup": "agentrl.tools.builtin.lookup:lookup",
    "python": "agentrl.tools.builtin.python:python",
}


def builtin_tool(name: str) -> Tool:
    if name not in BUILTIN:
        raise ValueError(f"unknown builtin tool {name!r}; available: {', '.join(BUILTIN)}")
    module, attr = BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), attr)


def builtin_tools(names: list[str]) -> list[Tool]:
    return [builtin_tool(n) for n in names]


__all__ = ["BUILTIN", "builtin_tool", "builtin_tools"]
