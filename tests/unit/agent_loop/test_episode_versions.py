"""Every policy token records the weight version that sampled it: per turn or per token as the engine reports it,
-1 on tool observations and template glue, nothing when the engine cannot say; episodes.jsonl keeps them and
old rows without them still load; with the real LocalEngine the versions are the engine's own."""

from __future__ import annotations

from scripted_engine import ScriptedEngine, model_turn

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.agent_loop.rollout import read_episodes, write_episodes
from agentrl.agent_loop.versions import as_version, sampled_versions
from agentrl.types import Episode, Generation, Task

TASK = Task(prompt=[{"role": "user", "content": "What is 2+2?"}], task_id="t0")


def turn(tokenizer, text: str, *, version=None, per_token=None) -> Generation:
    """A model turn ending with <|im_end|>, reporting `version` per turn and/or per-token versions:
    `per_token(number of tokens)` -> the list."""
    ids = list(tokenizer.encode(text, add_special_tokens=False)) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    metrics = {} if version is None else {"weight_version": version}
    return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", metrics=metrics,
                      weight_versions=[] if per_token is None else per_token(len(ids)))


def split(n: int) -> list[int]:
    """Versions of a turn during which new weights arrived: the first half sampled by 3, the rest by 4."""
    return [3] * (n // 2) + [4] * (n - n // 2)


async def run(tokenizer, registry, script) -> Episode:
    loop = ToolAgentLoop(ScriptedEngine(tokenizer, script), tokenizer, registry,
                         AgentLoopConfig(max_new_tokens_per_turn=64, max_response_tokens=500))
    return await loop.run(TASK, uid="g")


async def test_versions_per_turn_and_per_token_line_up_with_the_policy_tokens(tiny_tokenizer, registry):
    call = model_turn("", [("add", {"a": 2, "b": 2})])
    episode = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, call, version=3),
                                                   turn(tiny_tokenizer, "4", version=4, per_token=split)])
    episode.check()
    assert episode.num_turns == 2 and episode.tool_calls[0]["ok"]
    first = [v for v, t in zip(episode.response_versions, episode.turn_ids) if t == 0]
    second = [v for v, t in zip(episode.response_versions, episode.turn_ids) if t == 1]
    assert first == [3] * len(first) and second == split(len(second))  # the per-token list wins over the turn's
    assert all(v == -1 for v, m in zip(episode.response_versions, episode.response_mask) if m == 0)
    assert all(v >= 0 for v, m in zip(episode.response_versions, episode.response_mask) if m == 1)
    assert [t["weight_version"] for t in episode.turns] == [3, 4]


async def test_an_engine_that_reports_no_version_records_none(tiny_tokenizer, registry):
    call = model_turn("", [("add", {"a": 2, "b": 2})])
    unknown = await run(tiny_tokenizer, registry, [call, "4"])  # the scripted engine's metrics are empty
    assert unknown.response_versions == [] and unknown.num_turns == 2
    # one turn without a version makes the whole episode's versions unknown rather than half-filled
    half = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, call, version=2), "4"])
    assert half.response_versions == []
    # SGLang labels its weights with strings: integer labels and its initial "default" (0) count, others do not
    labelled = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version="7")])
    assert set(labelled.response_versions) == {7}
    default = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version="default")])
    assert set(default.response_versions) == {0}
    other = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version="step-7")])
    assert other.response_versions == []


async def test_per_token_versions_of_the_wrong_length_are_an_engine_fault(tiny_tokenizer, registry):
    episode = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version=1, per_token=lambda n: [1])])
    assert episode.infra_error and episode.metrics["stop_detail"] == "engine_error"
    assert "weight versions" in episode.metrics["infra_detail"]


def test_version_labels_and_sampled_versions():
    assert [as_version(x) for x in (0, 5, "12", " 3 ", "default", "v2", None, True, 1.5, "-1")] == \
        [0, 5, 12, 3, 0, None, None, None, None, None]
    gen = Generation(token_ids=[1, 2, 3], logprobs=[-1.0] * 3, finish_reason="stop", metrics={"weight_version": 2})
    assert sampled_versions(gen) == [2, 2, 2]
    gen.weight_versions = [1, 1, 2]
    assert sampled_versions(gen) == [1, 1, 2]


async def test_episodes_jsonl_keeps_versions_and_old_rows_still_load(tiny_tokenizer, registry, tmp_path):
    episode = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version=5)])
    write_episodes(tmp_path / "episodes.jsonl", [episode], step=1, n=1)
    row = read_episodes(tmp_path / "episodes.jsonl")[0]
    assert row["response_versions"] == episode.response_versions == [5] * len(episode.response_ids)
    assert Episode.from_dict(row).response_versions == episode.response_versions
    old = {k: v for k, v in row.items() if k != "response_versions"}  # a row written before versions existed
    loaded = Episode.from_dict(old)
    loaded.check()
    assert loaded.response_versions == []


async def test_local_engine_versions_are_the_engine_weight_version(tiny_model_dir):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine
    from agentrl.types import SamplingParams

    engine = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_model_len=512))
    try:
        loop = ToolAgentLoop(engine, engine.tokenizer, None, AgentLoopConfig(max_new_tokens_per_turn=8,
                                                                             max_response_tokens=16))
        sampling = SamplingParams(max_new_tokens=1, temperature=1.0, seed=1)
        before = await loop.run(TASK, sampling=sampling)
        await engine.update_weights(dict(engine.model.state_dict()))  # the same weights, pushed: version + 1
        after = await loop.run(TASK, sampling=sampling)
    finally:
        await engine.close()
    assert engine.weight_version == 1
    for episode, version in ((before, 0), (after, 1)):
        assert sum(episode.response_mask) > 0
        assert [v for v, m in zip(episode.response_versions, episode.response_mask) if m] == \
            [version] * sum(episode.response_mask)
        assert all(v == -1 for v, m in zip(episode.response_versions, episode.response_mask) if not m)


async def test_each_turn_records_the_server_that_sampled_it(tiny_tokenizer, registry):
    call = model_turn("", [("add", {"a": 2, "b": 2})])
    first, second = turn(tiny_tokenizer, call, version=1), turn(tiny_tokenizer, "4", version=1)
    first.metrics["server"] = "http://10.0.0.7:30000"  # SGLangEngine: the URL that answered
    second.metrics["replica"] = 1  # ReplicatedEngine: the replica's index
    episode = await run(tiny_tokenizer, registry, [first, second])
    assert [t["server"] for t in episode.turns] == ["http://10.0.0.7:30000", 1]
    silent = await run(tiny_tokenizer, registry, [turn(tiny_tokenizer, "4", version=1)])
    assert "server" not in silent.turns[0]  # an engine that does not say records nothing
