"""RunIndex and the viewer API on synthetic runs written by the real episode writer: groups, filters, search,
infra episodes apart, paging, a live run's appended and torn lines, tokens by kind."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from agentrl.agent_loop.rollout import write_episodes, write_train_records
from agentrl.types import Episode
from agentrl.viewer.bench import first_page_s, synthetic_run
from agentrl.viewer.index import Filters, RunIndex
from agentrl.viewer.server import create_app
from agentrl.viewer.tokens import _mask0_kinds


def _episode(uid: str, sample: int, reward: float, *, infra: bool = False, text: str = "hello",
             error_kind: str | None = None) -> Episode:
    return Episode(uid=uid, prompt_ids=[1, 2, 3], response_ids=[10, 11, 12, 13, 14], response_mask=[1, 1, 0, 0, 1],
                   response_logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0],
                   messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
                   reward=reward, infra_error=infra, finish_reason="infra_error" if infra else "stop",
                   tool_calls=[{"turn": 0, "name": "calc", "arguments": {}, "ok": error_kind is None,
                                "error_kind": error_kind}],
                   data_source="calc" if sample % 2 else "lookup", episode_id=f"{uid}-{sample}",
                   turn_ids=[0, 0, -1, -1, 1])


def _run(tmp_path):
    write_episodes(tmp_path / "episodes.jsonl", [
        _episode("s1-a", 0, 1.0), _episode("s1-a", 1, 0.0, text="the needle here"),
        _episode("s1-b", 0, 1.0), _episode("s1-b", 1, 1.0, error_kind="bad_arguments"),
        _episode("s1-b", 2, 0.0, infra=True)], step=1, n=3)
    write_episodes(tmp_path / "episodes.jsonl", [_episode("s2-a", 0, 0.0), _episode("s2-a", 1, 0.0)], step=2, n=2)
    return tmp_path


def test_groups_filters_and_search(tmp_path):
    idx = RunIndex(_run(tmp_path))
    assert idx.refresh() == 7
    groups = idx.groups(Filters())
    assert [(g["step"], g["uid"], len(g["episodes"])) for g in groups] == [(1, "s1-a", 2), (1, "s1-b", 2),
                                                                           (2, "s2-a", 2)]
    assert groups[1]["infra_errors"] == 1 and groups[1]["reward_mean"] == 1.0 and groups[1]["zero_variance"]
    assert [g["uid"] for g in idx.groups(Filters(zero_variance=True))] == ["s1-b", "s2-a"]
    assert [g["uid"] for g in idx.groups(Filters(step_min=2))] == ["s2-a"]
    assert [e.episode_id for g in idx.groups(Filters(query="NEEDLE")) for e in g["episodes"]] == ["s1-a-1"]
    assert [e.episode_id for g in idx.groups(Filters(error_kind="bad_arguments")) for e in g["episodes"]] == ["s1-b-1"]
    assert [e.episode_id for g in idx.groups(Filters(reward_min=0.5, data_source="lookup"))
            for e in g["episodes"]] == ["s1-a-0", "s1-b-0"]
    assert [e.episode_id for e in idx.infra_episodes(Filters())] == ["s1-b-2"]
    assert idx.read_episode(1)["messages"][1]["content"] == "the needle here"


def test_live_run_appends_and_torn_lines(tmp_path):
    idx = RunIndex(_run(tmp_path))
    idx.refresh()
    line = json.dumps({**_episode("s3-a", 0, 1.0).to_dict(), "step": 3, "sample_index": 0})
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write(line[:40])  # a line still being written
    assert idx.refresh() == 0
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write(line[40:] + "\n")
    assert idx.refresh() == 1
    assert idx.episodes[-1].step == 3 and idx.read_episode(7)["uid"] == "s3-a"


def test_api_pages_and_episode_tokens(tmp_path):
    import torch

    run = _run(tmp_path)
    trained = [Episode.from_dict({k: v for k, v in r.items() if k not in ("step", "sample_index")})
               for r in map(json.loads, (run / "episodes.jsonl").read_text().splitlines()[:2])]
    old_B_L = torch.tensor([[0.0, 0.0, 0.0, -0.4, -0.2, 0.0, 0.0, -0.9]] * 2)
    write_train_records(run, 1, trained, torch.tensor([0.5, -0.5]), old_B_L)
    with TestClient(create_app(run)) as client:
        info = client.get("/api/run").json()
        assert info["episodes"] == 7 and info["infra_errors"] == 1 and info["trained_episodes"] == 2
        assert info["kind"] == "train" and info["error_kinds"] == ["bad_arguments"]
        page = client.get("/api/groups", params={"page": 1, "size": 2}).json()
        assert page["total_groups"] == 3 and [g["uid"] for g in page["groups"]] == ["s2-a"]
        first = client.get("/api/groups", params={"size": 1}).json()["groups"][0]
        assert [e["advantage"] for e in first["episodes"]] == [0.5, -0.5]
        ep = client.get("/api/episode/0").json()
        policy = [t for t in ep["tokens"] if t["kind"] == "policy"]
        assert len(policy) == ep["sum_response_mask"] == 3
        assert [(t["lp"], t["tlp"]) for t in policy] == [(-0.5, -0.4), (-0.25, -0.2), (-1.0, -0.9)]
        assert [t["kind"] for t in ep["tokens"][:3]] == ["prompt"] * 3
        assert client.get("/api/episode/99").status_code == 404
        assert len(client.get("/api/group/1/s1-b").json()["episodes"]) == 3
        assert client.get("/api/infra").json()["episodes"][0]["episode_id"] == "s1-b-2"
        assert client.get("/api/metrics").json()["rows"] == []
        assert "agentrl view" in client.get("/").text and client.get("/static/app.js").status_code == 200


def test_episode_tokens_carry_weight_versions_and_old_rows_show_none(tmp_path):
    """Policy tokens carry the weight version that sampled them; a row written before versions were recorded
    (no response_versions key) renders as before."""
    spanning = _episode("s1-a", 0, 1.0)
    spanning.response_versions = [3, 3, -1, -1, 4]  # turn 1 sampled after an update
    write_episodes(tmp_path / "episodes.jsonl", [spanning], step=1, n=1)
    old = {k: v for k, v in _episode("s1-b", 0, 0.0).to_dict().items() if k != "response_versions"}
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write(json.dumps({**old, "step": 1, "sample_index": 0}) + "\n")
    with TestClient(create_app(tmp_path)) as client:
        ep = client.get("/api/episode/0").json()
        assert ep["weight_versions"] == [3, 4]
        assert [t.get("ver") for t in ep["tokens"][3:]] == [3, 3, None, None, 4]
        ep = client.get("/api/episode/1").json()
        assert ep["weight_versions"] == [] and not any("ver" in t for t in ep["tokens"])
        assert [t["kind"] for t in ep["tokens"][3:]] == ["policy", "policy", "glue", "glue", "policy"]


def test_observation_tokens_are_the_tool_content():
    pieces = ["a", "b", "\n<tool_response>\n", "the ", "value", "\n</tool_response>", "c"]
    assert _mask0_kinds(pieces, [1, 1, 0, 0, 0, 0, 1], ["the value"]) == \
        ["policy", "policy", "glue", "observation", "observation", "glue", "policy"]


@pytest.mark.parametrize("episodes", [2000])
def test_first_page_time_is_reported(tmp_path, episodes):
    """A measurement, not a limit: `agentrl bench view` does the same on 20,000 episodes."""
    synthetic_run(tmp_path, episodes=episodes, response_tokens=200)
    elapsed, page = first_page_s(tmp_path)
    print(f"first page of a {episodes}-episode run: {elapsed:.3f} s")
    assert len(page["groups"]) == 20


def _eval_record(name: str, model: str, pass_at_1: float) -> dict:
    """An eval.json record as `agentrl eval` writes it (the keys its report reads)."""
    return {"name": name, "model": model, "tasks_source": "suite calc",
            "settings": {"n": 2, "ks": [1, 2], "temperature": 1.0, "greedy": False, "top_p": 1.0, "top_k": -1,
                         "seed": 0, "success_threshold": 1.0},
            "summary": {"pass@1": pass_at_1, "pass@2": 0.75, "mean@n": pass_at_1, "num_tasks": 2},
            "infra_failures": {"count": 0, "by_cause": {}, "examples": []},
            "timing": {"total_s": 3.0, "episodes_per_s": 1.5, "model_tokens_per_s": 40.0},
            "tasks": [{"task_id": "t0", "valid": 2, "correct": 1}, {"task_id": "t1", "valid": 2, "correct": 1}]}


def test_eval_directory(tmp_path, qwen2_tokenizer_dir):
    """An `agentrl eval` output: eval.json names the model whose tokenizer decodes the tokens; the page gets the
    report as tables, and the comparison when `agentrl eval --compare` wrote compare.md there."""
    from agentrl.evaluation.run import compare_markdown, eval_markdown
    from agentrl.viewer.tokens import tokenizer_dir

    _run(tmp_path)
    record = _eval_record("m", str(qwen2_tokenizer_dir), 0.5)
    (tmp_path / "eval.json").write_text(json.dumps(record))
    assert tokenizer_dir(tmp_path) == qwen2_tokenizer_dir
    with TestClient(create_app(tmp_path)) as client:
        assert client.get("/api/run").json()["kind"] == "eval"
        page = client.get("/api/eval").json()
        tables = [b for b in page["report"] if b["type"] == "table"]
        assert tables[0]["header"] == ["metric", "m"]
        assert ["pass@1", "50.0%"] in tables[0]["rows"] and ["pass@2", "75.0%"] in tables[0]["rows"]
        assert page["compare"] is None and not page["pass_at_k"]
        assert "draws it when --n is above 1" in client.get("/api/eval/pass_at_k.png").json()["detail"]
        (tmp_path / "eval.md").write_text(eval_markdown(record))
        (tmp_path / "compare.md").write_text(compare_markdown([record, _eval_record("other", "x", 0.25)]))
        compare = client.get("/api/eval").json()["compare"]
        first = next(b for b in compare if b["type"] == "table")
        assert first["header"] == ["metric", "m", "other"] and ["pass@1", "50.0%", "25.0%"] in first["rows"]
        assert any(b["type"] == "paragraph" and "better on" in b["text"] for b in compare)
        tokens = client.get("/api/episode/0").json()["tokens"]
        assert tokens[3]["text"] != "<10>"  # decoded with the tokenizer, not shown as ids


def test_markdown_blocks_keep_headings_tables_lists_and_paragraphs():
    from agentrl.viewer.evalview import markdown_blocks

    text = "# Title\n\n| metric | a |\n|---|---|\n| pass@1 | 50.0% |\n\n- one `x`\n- two\n\nA line\nwrapped.\n"
    assert markdown_blocks(text) == [
        {"type": "heading", "level": 1, "text": "Title"},
        {"type": "table", "header": ["metric", "a"], "rows": [["pass@1", "50.0%"]]},
        {"type": "list", "items": ["one `x`", "two"]},
        {"type": "paragraph", "text": "A line wrapped."}]


def test_curve_panels_are_the_quickstart_panels_with_held_out_labels(tmp_path):
    import yaml

    from agentrl.trainer.curve_panels import CURVE_PANELS

    with TestClient(create_app(tmp_path)) as client:
        panels = client.get("/api/curves").json()["panels"]
        assert [p["key"] for p in panels[:5]] == [p.key for p in CURVE_PANELS if p.source == "grpo"]
        success = next(p for p in panels if p["key"] == "reward/success_rate")
        assert success["held_out"] == {"key": "val/reward/success_rate",
                                       "label": "held-out (val/reward/success_rate)"}  # no config.yaml to ask
        kl = next(p for p in panels if p["key"] == "actor/ppo_kl")
        assert [s["key"] for s in kl["series"]] == ["actor/ppo_kl", "actor/kl"]
    for trainer, label in [
            ({"val_n": 1, "val_temperature": 0.0, "test_freq": 5}, "held-out pass@1 (greedy, every 5 steps)"),
            ({"val_n": 4, "val_temperature": 1.0, "test_freq": 0}, "held-out success rate (n=4, T=1.0)")]:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
        with TestClient(create_app(tmp_path)) as client:
            panels = client.get("/api/curves").json()["panels"]
            assert next(p for p in panels if p["key"] == "reward/success_rate")["held_out"]["label"] == label
