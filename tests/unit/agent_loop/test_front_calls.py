"""Episode assembly from recorded front calls: one sample while prompts extend, a split where history was edited."""

from __future__ import annotations

import pytest

from agentrl.agent_loop.calls import assemble, episodes_from_calls
from agentrl.agent_loop.openai_front import CallRecord


def call(index: int, prompt: list[int], completion: list[int], *, versions=None, finish="stop") -> CallRecord:
    return CallRecord(episode_id="ep", prompt_ids=prompt, completion_ids=completion,
                      logprobs=[-(t % 7 + 1) / 10 for t in completion],
                      weight_versions=[3] * len(completion) if versions is None else versions,
                      finish_reason=finish, messages=[], message={}, rendered="continued" if index else "full",
                      ended_turn=True, index=index)


def test_calls_that_extend_each_other_make_one_sample():
    # prompt [1 2 3], model [10 11], glue [20 21], model [12], glue [22], model [13 14]
    calls = [call(0, [1, 2, 3], [10, 11]), call(1, [1, 2, 3, 10, 11, 20, 21], [12]),
             call(2, [1, 2, 3, 10, 11, 20, 21, 12, 22], [13, 14], versions=[4, 4])]
    (ep,) = episodes_from_calls(calls, uid="g", episode_id="g-0", messages=[{"role": "user", "content": "q"}],
                                reward=1.0)
    ep.check()
    assert ep.prompt_ids == [1, 2, 3]
    assert ep.response_ids == [10, 11, 20, 21, 12, 22, 13, 14]
    assert ep.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert ep.response_logprobs == [-0.4, -0.5, 0.0, 0.0, -0.6, 0.0, -0.7, -0.1]
    assert ep.response_versions == [3, 3, -1, -1, 3, -1, 4, 4]
    assert ep.turn_ids == [0, 0, -1, -1, 1, -1, 2, 2]
    assert (ep.reward, ep.num_turns, ep.episode_id, ep.uid) == (1.0, 3, "g-0", "g")
    assert ep.metrics["agent_splits"] == 0 and ep.metrics["agent_calls"] == 3


def test_edited_history_splits_the_episode_without_retokenizing():
    # call 1 extends call 0; call 2's prompt drops the first turn (the agent summarised its history): a new sample;
    # call 3 extends call 2.
    calls = [call(0, [1, 2], [10, 11]), call(1, [1, 2, 10, 11, 20], [12]),
             call(2, [1, 5, 20], [13]), call(3, [1, 5, 20, 13, 21], [14], finish="length")]
    first, second = episodes_from_calls(calls, uid="g", episode_id="g-1", messages=[], reward=0.5)
    assert (first.prompt_ids, first.response_ids, first.response_mask) == ([1, 2], [10, 11, 20, 12], [1, 1, 0, 1])
    assert (second.prompt_ids, second.response_ids, second.response_mask) == ([1, 5, 20], [13, 21, 14], [1, 0, 1])
    assert second.response_logprobs == [-0.7, 0.0, -0.1]
    assert [e.episode_id for e in (first, second)] == ["g-1", "g-1-part1"]
    assert [e.metrics["agent_splits"] for e in (first, second)] == [1, 1]
    assert [e.metrics["sample_part"] for e in (first, second)] == [0, 1]
    assert (first.reward, second.reward) == (0.5, 0.5)
    assert (first.finish_reason, second.finish_reason) == ("stop", "length")


def test_a_call_that_differs_by_one_token_is_split_not_stitched():
    # The re-rendered history differs from what was sampled in one id (a re-tokenization): never joined.
    samples = assemble([call(0, [1, 2], [10, 11]), call(1, [1, 2, 10, 99, 20], [12])])
    assert [s.prompt_ids for s in samples] == [[1, 2], [1, 2, 10, 99, 20]]


def test_branches_join_the_sample_they_extend():
    # Two choices of one request (n=2): the agent continues the second one; the first stays its own sample.
    samples = assemble([call(0, [1], [10]), call(1, [1], [11]), call(2, [1, 11, 20], [12])])
    assert [(s.prompt_ids, s.response_ids) for s in samples] == [([1], [10]), ([1], [11, 20, 12])]


def test_unknown_versions_and_no_calls():
    (ep,) = episodes_from_calls([call(0, [1], [10, 11], versions=[])], uid="g", episode_id="e", messages=[])
    assert ep.response_versions == []
    with pytest.raises(ValueError, match="made no calls"):
        episodes_from_calls([], uid="g", episode_id="e", messages=[])
