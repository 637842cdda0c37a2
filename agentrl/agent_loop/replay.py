"""Deterministic replay: re-run one recorded episode's agent loop and compare its tokens with the record.

What the record holds (`Episode.turns`, `Episode.replay`, the `response` of each `Episode.tool_calls` entry):
the sampling parameters and seed of every engine call, the raw tool responses, the task's tool names, schemas
and tools_kwargs, the number of prompt messages, the agent config and the engine (class, model, weight
version, context window). Replay builds the same `ToolAgentLoop` over a `RecordedTools` registry that answers
each call with the recorded response (no tool services run), so the only sources of difference left are the
weights, the chat template / tokenizer, the parser and the engine's numerics.

The tokens are identical when the same weights run on the same kind of machine with the same batching: the
engine seeds each request's private RNG (`inference.sampling.make_generator`), but an episode that shared
decode batches with others during the run can see logits that differ in the last bits from a replay that runs
alone, and a near-tie then picks another token. The report names the first token that differs and the step
responsible: the prompt template, a model turn (sampling), the parser (a tool call read differently), the
template glue after a turn, or a stop condition.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.rollout import EPISODES_FILE
from agentrl.agent_loop.tool_agent import ToolAgentLoop
from agentrl.errors import UserError
from agentrl.tools.base import ToolResult
from agentrl.types import Episode, SamplingParams, Task


class ReplayError(UserError):
    """The episode cannot be replayed (not found, recorded before replay data was kept, no model)."""


@dataclass
class RecordedTools:
    """A tool registry that answers from an episode's recorded tool responses, in call order.

    A call whose (name, arguments) is not the next unused recorded one gets an error result and is listed in
    `mismatches`: the replayed model turn was parsed into a different call than during the run."""

    schemas_: list[dict]
    records: list[dict]
    mismatches: list[dict] = field(default_factory=list)
    _used: set[int] = field(default_factory=set)

    async def start(self) -> None:
        return None

    def names(self) -> list[str]:
        return [s["function"]["name"] if "function" in s else s["name"] for s in self.schemas_]

    def schemas(self, names: list[str] | None = None) -> list[dict]:
        if names is None:
            return list(self.schemas_)
        by_name = dict(zip(self.names(), self.schemas_))
        return [by_name[n] for n in names if n in by_name]

    @contextlib.asynccontextmanager
    async def episode_session(self, tools_kwargs: dict | None = None):
        yield None

    async def call(self, name: str, arguments, session: str | None = None) -> ToolResult:
        for i, record in enumerate(self.records):
            if i in self._used or "response" not in record:
                continue
            if record["name"] == name and record["arguments"] == arguments:
                self._used.add(i)
                r = record["response"]
                return ToolResult(content=r["content"], is_error=r["is_error"], error_kind=r["error_kind"],
                                  metrics=dict(r.get("metrics") or {}), latency_s=record.get("latency_s", 0.0))
        self.mismatches.append({"name": name, "arguments": arguments})
        return ToolResult.error("tool_error", f"replay: no recorded response for {name}({json.dumps(arguments)})")

    async def aclose(self) -> None:
        return None


@dataclass
class Divergence:
    index: int  # position in response_ids (-1: the prompt)
    expected: int | None  # the recorded token id (None: the record ended here)
    got: int | None  # the replayed token id (None: the replay ended here)
    step: str  # "prompt template" | "model turn K (sampling)" | "parser" | "template glue after turn K" | "stop"
    detail: str


@dataclass
class ReplayResult:
    identical: bool
    recorded: Episode
    replayed: Episode
    divergence: Divergence | None
    max_logprob_diff: float  # over the policy tokens both share, before the divergence

    def report(self, tokenizer=None) -> str:
        r, p = self.recorded, self.replayed
        head = (f"episode {r.episode_id}: {len(r.response_ids)} recorded response tokens, {len(p.response_ids)} "
                f"replayed; finish {r.finish_reason} / {p.finish_reason}")
        if self.identical:
            return (f"{head}\nidentical: every prompt and response token and the mask match "
                    f"(max |logprob difference| {self.max_logprob_diff:.2e})")
        d = self.divergence
        show = (lambda t: "end" if t is None else f"{t} {tokenizer.decode([t])!r}" if tokenizer else str(t))
        return (f"{head}\nDIVERGED at token {d.index}: expected {show(d.expected)}, got {show(d.got)}\n"
                f"step: {d.step}\n{d.detail}")


def find_episode(run_dir: str | Path, episode: str) -> dict:
    """The episodes.jsonl row whose episode_id is `episode`, or row number `episode` (0-based, as the viewer's)."""
    path = Path(run_dir) / EPISODES_FILE
    if not path.is_file():
        raise ReplayError(f"{path} does not exist: pass a run directory (or `agentrl eval` output) with episodes")
    row = int(episode) if episode.isdigit() else None
    needle = f'"episode_id": {json.dumps(episode)}'
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == row or needle in line:
                return json.loads(line)
    raise ReplayError(f"no episode {episode!r} in {path}: give an episode_id (as `agentrl view` shows it) or a "
                      "row number")


def replay_inputs(row: dict) -> tuple[Task, SamplingParams, AgentLoopConfig, RecordedTools | None]:
    """The task, base sampling params, agent config and recorded tools that reproduce episode `row`."""
    rec = row.get("replay") or {}
    if not rec or not row.get("turns"):
        raise ReplayError(f"episode {row.get('episode_id') or row.get('uid')} has no replay record (written by an "
                          "agentrl version before replay data was recorded)")
    if rec.get("env") is not None:
        raise ReplayError(f"episode {row.get('episode_id') or row.get('uid')} was played against environment "
                          f"{rec['env']['name']!r}; agentrl replay re-runs tool episodes only (environments are not "
                          "recorded call by call)")
    task = Task(prompt=row["messages"][: rec["prompt_messages"]], tools=rec["tools"],
                tools_kwargs=rec["tools_kwargs"] or {}, task_id=row.get("task_id", ""),
                data_source=row.get("data_source", "unknown"))
    agent = {k: v for k, v in rec["agent"].items() if k in AgentLoopConfig.model_fields}
    agent["episode_timeout_s"] = None  # wall-clock limits are not reproducible; compare tokens instead
    if agent.get("max_model_len") is None:
        agent["max_model_len"] = rec["engine"].get("max_model_len")
    tools = None if rec["tool_schemas"] is None and not row.get("tool_calls") else \
        RecordedTools(rec["tool_schemas"] or [], row.get("tool_calls") or [])
    return task, SamplingParams(**rec["sampling"]), AgentLoopConfig(**agent), tools


async def replay_episode(row: dict, engine, tokenizer) -> ReplayResult:
    """Re-run episode `row` (an episodes.jsonl row) on `engine` and compare."""
    task, sampling, agent, tools = replay_inputs(row)
    loop = ToolAgentLoop(engine, tokenizer, tools, agent)
    replayed = await loop.run(task, sampling=sampling, uid=row.get("uid", ""), session_id=row.get("episode_id"))
    recorded = Episode.from_dict(row)
    return compare(recorded, replayed, tools.mismatches if tools is not None else [])


def compare(recorded: Episode, replayed: Episode, mismatches: list[dict] | None = None) -> ReplayResult:
    """Token-by-token comparison, with the first divergence attributed to the step that produced it."""
    diffs = [abs(a - b) for a, b, m in zip(recorded.response_logprobs, replayed.response_logprobs,
                                           recorded.response_mask) if m]
    if recorded.prompt_ids != replayed.prompt_ids:
        i = next((k for k, (a, b) in enumerate(zip(recorded.prompt_ids, replayed.prompt_ids)) if a != b),
                 min(len(recorded.prompt_ids), len(replayed.prompt_ids)))
        d = Divergence(-1, _at(recorded.prompt_ids, i), _at(replayed.prompt_ids, i), "prompt template",
                       f"prompt token {i} differs: the chat template or tokenizer renders the task's prompt "
                       "differently (another tokenizer, template or tool schemas)")
        return ReplayResult(False, recorded, replayed, d, 0.0)
    a, b = recorded.response_ids, replayed.response_ids
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) == len(b):
        if recorded.response_mask == replayed.response_mask:
            return ReplayResult(True, recorded, replayed, None, max(diffs, default=0.0))
        i = next(k for k, (x, y) in enumerate(zip(recorded.response_mask, replayed.response_mask)) if x != y)
        d = Divergence(i, a[i], b[i], "mask", f"the same token has mask {recorded.response_mask[i]} in the record "
                       f"but {replayed.response_mask[i]} in the replay")
        return ReplayResult(False, recorded, replayed, d, max(diffs[:i], default=0.0))
    if i is None:
        i = min(len(a), len(b))
    policy_before = sum(recorded.response_mask[:i])
    d = Divergence(i, _at(a, i), _at(b, i), *_blame(recorded, replayed, i, mismatches or []))
    return ReplayResult(False, recorded, replayed, d, max(diffs[:policy_before], default=0.0))


def _blame(recorded: Episode, replayed: Episode, i: int, mismatches: list[dict]) -> tuple[str, str]:
    turn = _turn_at(recorded, i)
    if i >= len(recorded.response_ids) or i >= len(replayed.response_ids):
        return "stop", (f"one side ended at token {i}: recorded finish {recorded.finish_reason} "
                        f"({recorded.metrics.get('stop_detail')}), replayed {replayed.finish_reason} "
                        f"({replayed.metrics.get('stop_detail')})")
    if recorded.response_mask[i]:
        lp = recorded.response_logprobs[i]
        got_lp = replayed.response_logprobs[i] if replayed.response_mask[i] else None
        seeds = [t["params"].get("seed") for t in recorded.turns]
        return f"model turn {turn} (sampling)", (
            f"the engine sampled another token (recorded logprob {lp:.5f}, replayed token's logprob "
            f"{got_lp if got_lp is None else f'{got_lp:.5f}'}; recorded per-turn seeds {seeds}): other weights, "
            "dtype or kernels, or the run batched this episode with others (logits differ in the last bits)")
    if mismatches:
        return "parser", (f"turn {turn}'s text was parsed into tool calls the run did not make: {mismatches[:3]} "
                          "(the parser or the sampled text differs)")
    return f"template glue after turn {turn}", (
        "the tokens between turns differ: the chat template or tokenizer renders the tool responses or the next "
        "generation prompt differently from the run's")


def _turn_at(episode: Episode, i: int) -> int:
    """The assistant turn that token i belongs to, or for glue the turn it follows."""
    turns = episode.turn_ids or []
    for k in range(min(i, len(turns) - 1), -1, -1):
        if turns[k] >= 0:
            return turns[k]
    return 0


def _at(ids: list[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None


__all__ = ["Divergence", "RecordedTools", "ReplayError", "ReplayResult", "compare", "find_episode",
           "replay_episode", "replay_inputs"]
