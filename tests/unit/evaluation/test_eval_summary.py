from __future__ import annotations

import math

import pytest

from agentrl.evaluation.metrics import pass_at_k, summarize
from agentrl.types import Episode


def ep(task: str, reward: float, *, infra=False, source="calc", calls=(), turns=1) -> Episode:
    return Episode(uid=task, prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 0], response_logprobs=[-0.5, 0.0],
                   messages=[], reward=reward, finish_reason="infra_error" if infra else "stop", num_turns=turns,
                   tool_calls=list(calls), infra_error=infra, task_id=task, data_source=source)


def test_pass_at_k_matches_the_combinatorial_definition():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 3), (20, 1, 10)]:
        expected = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_summary_excludes_infra_failures_from_success_and_counts_them():
    eps = [ep("a", 1.0), ep("a", 0.0), ep("b", 0.0), ep("b", 0.0, infra=True), ep("c", 0.0, infra=True)]
    s = summarize(eps, ks=(1, 2))
    assert s["num_tasks"] == 3 and s["num_episodes"] == 5
    assert s["infra_failed_episodes"] == 2 and s["tasks_without_valid_samples"] == 1
    assert s["mean@n"] == pytest.approx(1 / 3)
    # task a: 1 of 2 right -> pass@1 0.5, pass@2 1.0; task b: 1 valid sample, wrong -> pass@1 0
    assert s["pass@1"] == pytest.approx(0.25)
    assert s["pass@2"] == pytest.approx(1.0)  # only task a has 2 valid samples


def test_tool_error_rates_and_per_source_breakdown():
    calls_ok = [{"name": "calculator", "ok": True}]
    calls_bad = [{"name": "calculator", "ok": False, "error_kind": "bad_arguments"},
                 {"name": "nope", "ok": False, "error_kind": "unknown_tool"}]
    eps = [ep("a", 1.0, calls=calls_ok, turns=2), ep("b", 0.0, source="lookup", calls=calls_bad, turns=3)]
    s = summarize(eps)
    assert s["tool_calls_per_episode"] == pytest.approx(1.5)
    assert s["tool_error_rate"] == pytest.approx(2 / 3)
    assert s["tool_errors_by_kind"] == {"bad_arguments": 1, "unknown_tool": 1}
    assert s["avg_turns"] == pytest.approx(2.5)
    assert s["by_data_source"]["calc"]["pass@1"] == 1.0
    assert s["by_data_source"]["lookup"]["pass@1"] == 0.0


def test_markdown_report_compares_two_models_per_source():
    from agentrl.evaluation.report import markdown_report

    before = summarize([ep("a", 0.0), ep("b", 1.0, source="lookup")], ks=(1,))
    after = summarize([ep("a", 1.0), ep("b", 1.0, source="lookup")], ks=(1,))
    md = markdown_report("held-out", {"after SFT": before, "after GRPO": after})
    assert "| metric | after SFT | after GRPO |" in md
    assert "| pass@1 | 50.0% | 100.0% |" in md
    assert "## calc" in md and "## lookup" in md
