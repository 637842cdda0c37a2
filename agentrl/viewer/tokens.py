"""An episode's tokens as the viewer shows them: decoded text, who produced each token, its logprobs.

Kinds: "prompt" (the task's prompt ids), "policy" (response_mask 1: sampled by the model), "observation" (mask 0,
inside the text of a tool response) and "glue" (mask 0, the rest: what the chat template writes between turns).
Observation vs glue is found by locating each tool message's content in the decoded text of the mask-0 run
that follows the tool call; a content the template rewrote (or cut by multi-byte characters split across
tokens) is shown as glue.

The tokenizer is the run's: `final_model/` when the run wrote one, else config.yaml's model.tokenizer_path or
model.path, else the `model` of an evaluation's eval.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def tokenizer_dir(run_dir: str | Path) -> Path | None:
    """Where the run's tokenizer files are (None when the run does not say or the directory is gone)."""
    run_dir = Path(run_dir)
    candidates = [run_dir / "final_model"]
    config = run_dir / "config.yaml"
    if config.is_file():
        model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
        candidates += [Path(p) for p in (model.get("tokenizer_path"), model.get("path")) if p]
    eval_json = run_dir / "eval.json"
    if eval_json.is_file():
        model = json.loads(eval_json.read_text()).get("model")
        if model:
            candidates += [Path(model), Path(model) / "hf"]
    for path in candidates:
        if not path.is_absolute():
            path = (run_dir / path) if (run_dir / path).exists() else path
        if (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file():
            return path
    return None


def load_tokenizer(path: Path | None):
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """One display string per id (the id in angle brackets when there is no tokenizer)."""
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def episode_tokens(episode: dict, tokenizer, trainer_logprobs: list[float] | None = None) -> list[dict]:
    """[{i, id, text, kind, turn, lp, tlp, ver}] over prompt + response. `lp`: rollout logprob, `tlp`: trainer
    logprob (policy tokens only; None when not recorded), `ver`: the weight version that sampled the token
    (policy tokens of episodes that recorded versions only)."""
    prompt, response = episode["prompt_ids"], episode["response_ids"]
    mask, logprobs = episode["response_mask"], episode["response_logprobs"]
    turns = episode.get("turn_ids") or [-1] * len(response)
    versions = episode.get("response_versions") or []  # absent from episodes written before versions existed
    pieces = token_pieces(tokenizer, prompt + response)
    out = [{"i": i, "id": t, "text": pieces[i], "kind": "prompt"} for i, t in enumerate(prompt)]
    kinds = _mask0_kinds(pieces[len(prompt):], mask, _tool_contents(episode))
    for j, t in enumerate(response):
        tok = {"i": len(prompt) + j, "id": t, "text": pieces[len(prompt) + j], "kind": kinds[j], "turn": turns[j]}
        if mask[j]:
            tok["lp"] = logprobs[j]
            tok["tlp"] = None if trainer_logprobs is None else trainer_logprobs[j]
            if versions:
                tok["ver"] = versions[j]
        out.append(tok)
    return out


def policy_versions(episode: dict) -> list[int]:
    """The distinct weight versions that sampled the episode's policy tokens, oldest first ([] when the episode
    recorded none)."""
    versions = episode.get("response_versions") or []
    return sorted({v for v, m in zip(versions, episode["response_mask"]) if m})


def _tool_contents(episode: dict) -> list[str]:
    return [m["content"] for m in episode.get("messages") or []
            if m.get("role") == "tool" and isinstance(m.get("content"), str) and m["content"]]


def _mask0_kinds(pieces: list[str], mask: list[int], contents: list[str]) -> list[str]:
    """"policy" where mask is 1; "observation" on the characters of a tool content found in order inside
    the mask-0 runs, "glue" on the rest."""
    kinds = ["policy" if m else "glue" for m in mask]
    pending = list(contents)
    j = 0
    while j < len(mask) and pending:
        if mask[j]:
            j += 1
            continue
        start = j
        while j < len(mask) and not mask[j]:
            j += 1
        text = "".join(pieces[start:j])
        ends = []  # character offset where each token of the run ends
        pos = 0
        for k in range(start, j):
            pos += len(pieces[k])
            ends.append(pos)
        search_from = 0
        while pending:
            at = text.find(pending[0], search_from)
            if at < 0:
                break
            lo, hi = at, at + len(pending[0])
            for k in range(start, j):
                begin = ends[k - start] - len(pieces[k])
                if begin < hi and ends[k - start] > lo:
                    kinds[k] = "observation"
            search_from = hi
            pending.pop(0)
    return kinds


__all__ = ["episode_tokens", "load_tokenizer", "policy_versions", "token_pieces", "tokenizer_dir"]
