"""Training samples from the calls an agent program made through the policy front (`openai_front.CallRecord`).

An episode's calls become one sample while each call's prompt ids extend an earlier call's prompt + completion
ids: the sampled ids get mask 1 (with their logprobs and weight versions), the ids between (tool results, user
messages, template glue) mask 0. A call whose prompt extends no earlier call (the agent edited, summarised or
dropped part of its history, or the template rewrote it) starts a new sample, as prime-rl does: the ids are
never re-tokenized or stitched. Each sample becomes one `Episode` with the episode's group uid and reward; the
episode's number of splits (samples - 1) is in every sample's metrics (`agent_splits`) and summed by
`rollout_metrics` as `rollout/agent_splits`.

GRPO-family estimators count a split episode once in its group (`split_episode_ids`), each part with the
episode's advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.agent_loop.openai_front import CallRecord
from agentrl.types import Episode


@dataclass
class Sample:
    """One training row: `prompt_ids`, then everything after it, token-aligned."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    versions_known: bool = True
    calls: list[CallRecord] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def extended_by(self, prompt_ids: list[int]) -> bool:
        n = len(self.prompt_ids) + len(self.response_ids)
        return len(prompt_ids) >= n and prompt_ids[:n] == self.ids

    def add(self, call: CallRecord, turn: int) -> None:
        glue = call.prompt_ids[len(self.prompt_ids) + len(self.response_ids):] if self.calls else []
        self.response_ids += glue
        self.mask += [0] * len(glue)
        self.logprobs += [0.0] * len(glue)
        self.versions += [-1] * len(glue)
        self.turn_ids += [-1] * len(glue)
        ids = call.completion_ids
        self.response_ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += call.logprobs
        self.versions_known = self.versions_known and len(call.weight_versions) == len(ids)
        self.versions += call.weight_versions if len(call.weight_versions) == len(ids) else [-1] * len(ids)
        self.turn_ids += [turn] * len(ids)
        self.calls.append(call)


def assemble(calls: list[CallRecord]) -> list[Sample]:
    """The samples of one episode's calls (in call order); a call joins the latest sample its prompt extends."""
    samples: list[Sample] = []
    for turn, call in enumerate(sorted(calls, key=lambda c: c.index)):
        target = next((s for s in reversed(samples) if s.extended_by(call.prompt_ids)), None)
        if target is None:
            target = Sample(prompt_ids=list(call.prompt_ids))
            samples.append(target)
        target.add(call, turn)
    return samples


def episodes_from_calls(calls: list[CallRecord], *, uid: str, episode_id: str, messages: list[dict],
                        reward: float = 0.0, task_id: str = "", data_source: str = "unknown",
                        metrics: dict | None = None) -> list[Episode]:
    """One Episode per sample of `calls`; the first keeps `episode_id`, later ones get "-part1", "-part2", ...
    `messages`: the episode's transcript (on every sample). Raises ValueError for an episode without calls."""
    samples = assemble(calls)
    if not samples:
        raise ValueError(f"episode {episode_id} made no calls to the policy")
    out = []
    for k, s in enumerate(samples):
        last = s.calls[-1]
        m = dict(metrics or {})
        m.update(agent_calls=len(calls), agent_splits=len(samples) - 1, sample_part=k,
                 front_full_renders=sum(c.rendered == "full" for c in s.calls[1:]),
                 response_tokens=len(s.response_ids), policy_tokens=sum(s.mask))
        out.append(Episode(
            uid=uid, prompt_ids=s.prompt_ids, response_ids=s.response_ids, response_mask=s.mask,
            response_logprobs=s.logprobs, messages=messages, reward=reward,
            finish_reason="length" if last.finish_reason == "length" else "stop", num_turns=len(s.calls),
            metrics=m, task_id=task_id, data_source=data_source, turn_ids=s.turn_ids,
            response_versions=s.versions if s.versions_known else [],
            episode_id=episode_id if k == 0 else f"{episode_id}-part{k}",
            turns=[{"tokens": len(c.completion_ids), "finish_reason": c.finish_reason, "rendered": c.rendered,
                    "input_tokens": len(c.prompt_ids)} for c in s.calls]))
    return out


def split_episode_ids(episodes: list[Episode]) -> list[str]:
    """One id per sample, equal for the parts of one split episode (`episodes_from_calls`) and unique otherwise:
    the group estimators count a split episode once (`AdvantageInputs.episode_ids`)."""
    ids = []
    for row, ep in enumerate(episodes):
        part = ep.metrics.get("sample_part", 0)
        base = ep.episode_id.removesuffix(f"-part{part}") if part else ep.episode_id
        ids.append(f"{ep.uid}/{base}" if base else f"{ep.uid}/#{row}")
    return ids


__all__ = ["Sample", "assemble", "episodes_from_calls", "split_episode_ids"]
