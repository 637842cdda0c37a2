"""`lookup`: key-value search over a JSONL knowledge base, for multi-hop question answering.

Knowledge-base rows (one JSON object per line): {"entity": str, "facts": {relation: value}}. The KB path is
per session: the service (or in-process registry) default `{"lookup": {"kb_path": ...}}`, overridable per task
through `tools_kwargs`. A KB file is parsed once per process and shared by every session that names it
(reloaded when the file changes).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from agentrl.tools.base import ToolError, tool


def normalize_entity(name: str) -> str:
    """Case-, space- and punctuation-insensitive key: "The  Eiffel-Tower" -> "the eiffel tower"."""
    return " ".join(re.sub(r"[^\w]+", " ", name.casefold()).split())


@dataclass(frozen=True)
class KnowledgeBase:
    path: str
    facts: dict[str, dict]  # normalized entity -> facts
    names: dict[str, str]  # normalized entity -> entity as written

    @classmethod
    def load(cls, path: str | Path) -> KnowledgeBase:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"lookup knowledge base {p} does not exist (set tools_kwargs "
                                    f"{{'lookup': {{'kb_path': ...}}}} or the service default)")
        facts: dict[str, dict] = {}
        names: dict[str, str] = {}
        with p.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("entity"), str) \
                        or not isinstance(row.get("facts"), dict):
                    raise ValueError(f"{p}:{lineno}: a row must be {{\"entity\": str, \"facts\": {{relation: "
                                     f"value}}}}, got {line.strip()[:120]}")
                key = normalize_entity(row["entity"])
                facts.setdefault(key, {}).update(row["facts"])
                names.setdefault(key, row["entity"])
        return cls(path=str(p), facts=facts, names=names)

    def find(self, entity: str) -> tuple[str, dict]:
        """(entity as written, facts); raises ToolError naming close matches when the entity is unknown."""
        key = normalize_entity(entity)
        if key in self.facts:
            return self.names[key], self.facts[key]
        close = difflib.get_close_matches(key, list(self.facts), n=3, cutoff=0.75)
        hint = f" Did you mean: {', '.join(self.names[c] for c in close)}?" if close else ""
        raise ToolError(f"no entry for {entity!r} in the knowledge base.{hint}")


_CACHE: dict[str, tuple[float, KnowledgeBase]] = {}
_CACHE_LOCK = threading.Lock()


def load_kb(kb_path: str) -> KnowledgeBase:
    """The parsed KB at `kb_path`, shared across sessions; re-read when the file's mtime changes."""
    path = os.path.abspath(kb_path)
    mtime = os.path.getmtime(path) if os.path.exists(path) else -1.0
    with _CACHE_LOCK:
        hit = _CACHE.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
    kb = KnowledgeBase.load(path)
    with _CACHE_LOCK:
        _CACHE[path] = (mtime, kb)
    return kb


def format_fact(relation: str, value) -> str:
    """One fact as `format_facts` writes it inside its object: `"based_in": "Lomira"` (what a demonstration
    quotes before following it)."""
    return json.dumps({relation: value}, ensure_ascii=False)[1:-1]


def format_facts(entity: str, facts: dict) -> str:
    """One JSON object: {"entity": ..., relation: value, ...} (values are quoted as in a call's arguments, so a
    value copied into the next call or the answer is the same tokens)."""
    fields = {"entity": entity, **facts}
    return "{" + ", ".join(format_fact(relation, value) for relation, value in fields.items()) + "}"


async def lookup_session(kb_path: str | None = None) -> KnowledgeBase:
    if not kb_path:
        raise ValueError("the lookup tool needs a knowledge base: tools_kwargs {'lookup': {'kb_path': 'kb.jsonl'}} "
                         "or `--tool-kwargs` on the service")
    return await asyncio.to_thread(load_kb, kb_path)  # a large KB must not stall the service's event loop


@tool(session_factory=lookup_session, inline=True)
def lookup(entity: str, *, session: KnowledgeBase) -> str:
    """Look up an entity in the knowledge base and return all known facts about it.

    Args:
        entity: The entity's name, e.g. "Marie Curie" (case and punctuation do not matter).
    """
    name, facts = session.find(entity)
    return format_facts(name, facts)


__all__ = ["KnowledgeBase", "format_fact", "format_facts", "load_kb", "lookup", "lookup_session", "normalize_entity"]
