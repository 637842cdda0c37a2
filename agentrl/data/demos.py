"""SFT demonstrations: reading the JSONL rows and turning each transcript into (input_ids, loss_mask).

A row is {"messages": [OpenAI messages], "tools": [OpenAI function schemas] | null}; `agentrl data demos SUITE
OUT.jsonl` writes them (agentrl/data/suites/demos.py) and `agentrl sft` trains on them (agentrl/trainer/sft.py).
`agentrl sft --check` reads every row with `load_demos` before any model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path


def encode_transcript(chat, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one transcript; `chat` is an `agentrl.agent_loop.chat.ChatTemplate`.

    Rendered at assistant-turn boundaries only, so templates that group consecutive tool messages into one turn
    (Qwen2.5) are fine. Raises TemplateError when the template is not append-only at those boundaries or when
    piecewise encoding would differ from encoding the whole text (the ids must be what the model would see).
    """
    from agentrl.agent_loop.chat import TemplateError

    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError("transcript has no assistant message: nothing to learn")
    ids: list[int] = []
    mask: list[int] = []
    done = ""
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = chat.render(messages[:i], add_generation_prompt=True)
        end = chat.render(messages[: i + 1])
        if not start.startswith(done) or not end.startswith(start):
            raise TemplateError(f"chat template is not append-only at assistant message {i}: SFT masks would "
                                "not match what the agent loop trains")
        turn = end[len(start):]
        cut = turn.find(chat.end_of_turn)
        if cut < 0:
            raise TemplateError(f"assistant message {i} renders without the end-of-turn token {chat.end_of_turn!r}")
        cut += len(chat.end_of_turn)
        for text, flag in ((start[len(done):], 0), (turn[:cut], 1), (turn[cut:], 0)):
            piece = chat.encode(text) if text else []
            ids += piece
            mask += [flag] * len(piece)
        done = end
    if done != chat.render(messages):  # trailing non-assistant messages are not trained
        tail = chat.render(messages)[len(done):]
        piece = chat.encode(tail)
        ids += piece
        mask += [0] * len(piece)
    if ids != chat.encode(chat.render(messages)):
        raise TemplateError("encoding the transcript turn by turn gives other ids than encoding it whole; the "
                            "tokenizer merges across a turn boundary")
    return ids, mask


def load_demos(paths: list[str]) -> list[dict]:
    """Read SFT rows, failing with the file, row number and field on a malformed row."""
    rows = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"SFT data file {p} does not exist (make one with `agentrl data demos`)")
        for n, line in enumerate(p.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not valid JSON ({e})") from None
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
                raise ValueError(f"{p}:{n}: field 'messages' must be a non-empty list of chat messages")
            if row.get("tools") is not None and not isinstance(row["tools"], list):
                raise ValueError(f"{p}:{n}: field 'tools' must be a list of OpenAI function schemas or null")
            rows.append(row)
    if not rows:
        raise ValueError(f"no SFT rows in {paths}")
    return rows


def _schemas_key(tools) -> str:
    return json.dumps(tools, sort_keys=True)


def tokenize_demos(tokenizer, rows: list[dict], max_length: int) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Encode every row; returns (sequences, number skipped for exceeding max_length)."""
    from agentrl.agent_loop.chat import ChatTemplate

    templates: dict[str, ChatTemplate] = {}
    sequences, skipped = [], 0
    for row in rows:
        key = _schemas_key(row.get("tools"))
        if key not in templates:
            templates[key] = ChatTemplate(tokenizer, row.get("tools"))
        ids, mask = encode_transcript(templates[key], row["messages"])
        if len(ids) > max_length:
            skipped += 1
            continue
        sequences.append((ids, mask))
    return sequences, skipped
