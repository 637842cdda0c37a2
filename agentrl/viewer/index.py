"""`RunIndex`: the byte-offset index of a run directory's episodes.jsonl (and train_records.jsonl).

Each JSON line is parsed once, in a background thread, into a small `EpisodeSummary` (its byte offset and length
in the file, step, group, reward, finish reason, tool error kinds, the transcript's text for search); a full
episode is read back from disk by offset when it is opened. Pages are cut on the server, so a page of a
20,000-episode run costs what the page shows. The file is indexed in order, so the first page is ready after
its own rows are read, while the rest are still being indexed. `refresh()` picks up lines a live run appended
(a torn last line is read once it is complete).

Groups are (step, uid): the n episodes of one prompt. Infra-error episodes (`infra_error` True) belong to their
group but are kept out of its reward statistics and are listed on their own.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.agent_loop.rollout import EPISODES_FILE, TRAIN_RECORDS_FILE


@dataclass(slots=True)
class EpisodeSummary:
    row: int  # line number among the episodes (0-based): the episode's id in the viewer's URLs
    offset: int
    length: int
    step: int
    uid: str
    episode_id: str
    sample_index: int
    reward: float
    finish_reason: str
    infra_error: bool
    num_turns: int
    num_tool_calls: int
    error_kinds: tuple[str, ...]
    data_source: str
    task_id: str
    response_tokens: int
    policy_tokens: int
    text: str  # lower-cased transcript (every message's content and tool-call arguments), for search

    def to_json(self) -> dict:
        return {"row": self.row, "step": self.step, "uid": self.uid, "episode_id": self.episode_id,
                "sample_index": self.sample_index, "reward": self.reward, "finish_reason": self.finish_reason,
                "infra_error": self.infra_error, "num_turns": self.num_turns, "num_tool_calls": self.num_tool_calls,
                "error_kinds": list(self.error_kinds), "data_source": self.data_source, "task_id": self.task_id,
                "response_tokens": self.response_tokens, "policy_tokens": self.policy_tokens}


def summarize_row(d: dict, *, row: int, offset: int, length: int) -> EpisodeSummary:
    """The index entry of one episodes.jsonl row (Episode.to_dict() plus step and sample_index)."""
    calls = d.get("tool_calls") or []
    pieces = []
    for m in d.get("messages") or []:
        if isinstance(m.get("content"), str):
            pieces.append(m["content"])
        for c in m.get("tool_calls") or []:
            pieces.append(json.dumps(c.get("function", c), ensure_ascii=False))
    kinds = sorted({c["error_kind"] for c in calls if c.get("error_kind")})
    metrics = d.get("metrics") or {}
    return EpisodeSummary(
        row=row, offset=offset, length=length, step=int(d.get("step", 0)), uid=str(d.get("uid", "")),
        episode_id=str(d.get("episode_id") or f"{d.get('uid', '')}-{d.get('sample_index', row)}"),
        sample_index=int(d.get("sample_index", metrics.get("sample_index", 0))), reward=float(d.get("reward", 0.0)),
        finish_reason=str(d.get("finish_reason", "")), infra_error=bool(d.get("infra_error", False)),
        num_turns=int(d.get("num_turns", 0)), num_tool_calls=len(calls), error_kinds=tuple(kinds),
        data_source=str(d.get("data_source", "unknown")), task_id=str(d.get("task_id", "")),
        response_tokens=len(d.get("response_ids") or []), policy_tokens=sum(d.get("response_mask") or []),
        text="\n".join(pieces).lower())


@dataclass
class Filters:
    """What the episode list shows. None / empty: no constraint."""

    step_min: int | None = None
    step_max: int | None = None
    data_source: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    zero_variance: bool = False  # only groups whose (non-infra) rewards are all equal
    query: str = ""  # case-insensitive substring of the transcript

    def episode_ok(self, e: EpisodeSummary) -> bool:
        return ((self.step_min is None or e.step >= self.step_min)
                and (self.step_max is None or e.step <= self.step_max)
                and (not self.data_source or e.data_source == self.data_source)
                and (self.reward_min is None or e.reward >= self.reward_min)
                and (self.reward_max is None or e.reward <= self.reward_max)
                and (not self.finish_reason or e.finish_reason == self.finish_reason)
                and (not self.error_kind or self.error_kind in e.error_kinds)
                and (not self.query or self.query.lower() in e.text))


@dataclass
class _JsonlScan:
    """Incremental reader of one JSON-lines file: `read_new()` yields (offset, length, row) of complete lines."""

    path: Path
    position: int = 0

    def read_new(self):
        if not self.path.is_file():
            return
        size = self.path.stat().st_size
        if size < self.position:  # the file was cut (a resumed run rewinds it): start over
            self.position = 0
        if size == self.position:
            return
        with self.path.open("rb") as f:
            f.seek(self.position)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # a line still being written
                offset = self.position
                self.position += len(line)
                if line.strip():
                    yield offset, len(line), json.loads(line)


@dataclass
class RunIndex:
    run_dir: Path
    episodes: list[EpisodeSummary] = field(default_factory=list)
    train: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # episode_id -> (offset, len, adv)
    done: bool = False  # the background pass over the files as they were at its start has finished

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self._episodes_scan = _JsonlScan(self.run_dir / EPISODES_FILE)
        self._train_scan = _JsonlScan(self.run_dir / TRAIN_RECORDS_FILE)
        self._lock = threading.Lock()  # one reader of the files at a time
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    # --- building ---

    def start(self) -> "RunIndex":
        """Index in a background thread; returns at once."""
        self._thread = threading.Thread(target=self._index_all, name="agentrl-view-index", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _index_all(self) -> None:
        try:
            self.refresh()
        except (OSError, ValueError) as e:  # a corrupt line: say where, keep what was read
            self.error = f"{self.run_dir / EPISODES_FILE}: {e}"
        self.done = True

    def refresh(self) -> int:
        """Index lines appended since the last call; returns how many episodes were added."""
        with self._lock:
            added = 0
            for offset, length, d in self._episodes_scan.read_new():
                if offset == 0 and self.episodes:  # the file was rewritten
                    self.episodes = []
                self.episodes.append(summarize_row(d, row=len(self.episodes), offset=offset, length=length))
                added += 1
            for offset, length, d in self._train_scan.read_new():
                self.train[str(d["episode_id"])] = (offset, length, float(d["advantage"]))
            return added

    # --- reading ---

    def read_episode(self, row: int) -> dict:
        """The full episodes.jsonl row `row` (read from disk by offset)."""
        e = self.episodes[row]
        return json.loads(_read_at(self.run_dir / EPISODES_FILE, e.offset, e.length))

    def train_record(self, episode_id: str) -> dict | None:
        """The trainer's record of the episode (advantage, trainer_logprobs), None when it was not trained on."""
        hit = self.train.get(episode_id)
        if hit is None:
            return None
        return json.loads(_read_at(self.run_dir / TRAIN_RECORDS_FILE, hit[0], hit[1]))

    def advantage(self, episode_id: str) -> float | None:
        hit = self.train.get(episode_id)
        return None if hit is None else hit[2]

    def groups(self, filters: Filters) -> list[dict]:
        """Every (step, uid) group with at least one matching non-infra episode, in file order."""
        by_key: dict[tuple[int, str], list[EpisodeSummary]] = {}
        for e in list(self.episodes):
            by_key.setdefault((e.step, e.uid), []).append(e)
        out = []
        for (step, uid), members in by_key.items():
            ok = [e for e in members if not e.infra_error]
            rewards = [e.reward for e in ok]
            zero_var = len(set(rewards)) <= 1
            if filters.zero_variance and not zero_var:
                continue
            shown = [e for e in ok if filters.episode_ok(e)]
            if not shown:
                continue
            mean = sum(rewards) / len(rewards)
            std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
            out.append({"step": step, "uid": uid, "task_id": members[0].task_id,
                        "data_source": members[0].data_source, "reward_mean": mean, "reward_std": std,
                        "zero_variance": zero_var, "infra_errors": len(members) - len(ok), "size": len(members),
                        "episodes": shown})
        return out

    def infra_episodes(self, filters: Filters) -> list[EpisodeSummary]:
        return [e for e in list(self.episodes) if e.infra_error and filters.episode_ok(e)]

    def group_members(self, step: int, uid: str) -> list[EpisodeSummary]:
        return [e for e in list(self.episodes) if e.step == step and e.uid == uid]


def _read_at(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(length)


__all__ = ["EpisodeSummary", "Filters", "RunIndex", "summarize_row"]
