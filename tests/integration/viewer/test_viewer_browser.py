"""`agentrl view` in a real browser: headless Chromium (the system's, driven by Playwright) opens the page of a
real small run, goes to an episode and counts the tokens coloured as policy; reads the curves of a 200-step run
(ticks, smoothed lines, held-out marks); and shows an `agentrl eval` directory with its comparison. The
screenshots are test artifacts: they are kept in `test-artifacts/viewer/` at the repository root (or under
$AGENTRL_TEST_ARTIFACTS)."""

from __future__ import annotations

import math
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from helpers import free_port, service

from agentrl.agent_loop.rollout import read_episodes

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("AGENTRL_TEST_ARTIFACTS", Path(__file__).resolve().parents[3] / "test-artifacts"))
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                     "(pip install -e '.[dev]')")
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: `make chromium` installs Debian's chromium package (needs root and apt)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _view(run_dir: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["python", "-m", "agentrl.cli", "view", str(run_dir), "--port", str(port)], f"{url}/api/run"):
        yield url


@pytest.fixture(scope="module")
def viewer_url(recorded_run):
    yield from _view(recorded_run[0])


@pytest.fixture(scope="module")
def shots() -> Path:
    out = ARTIFACTS / "viewer"
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_episode_page_colours_exactly_the_policy_tokens(browser, viewer_url, recorded_run, shots):
    run_dir, _ = recorded_run
    rows = read_episodes(run_dir / "episodes.jsonl")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{viewer_url}/#/")
    page.wait_for_selector("#groups tr.episode-row")
    assert "groups" in page.inner_text("#summary")
    page.screenshot(path=str(shots / "viewer-groups.png"), full_page=True)
    target = next(i for i, r in enumerate(rows) if any(c["ok"] for c in r["tool_calls"]))
    page.click(f'#groups tr.episode-row[data-row="{target}"] a')
    page.wait_for_selector("#tokens .tok.policy")
    assert page.locator("#tokens .tok.policy").count() == sum(rows[target]["response_mask"])
    assert page.locator("#tokens .tok.observation").count() > 0  # the tool's answer, told apart from glue
    assert page.locator(".call").count() == len(rows[target]["tool_calls"])
    page.hover("#tokens .tok.policy >> nth=0")
    tip = page.inner_text("#tip")
    assert "rollout logprob" in tip and "trainer logprob" in tip and "difference" in tip
    # one engine, never updated: every policy token was sampled by weight version 0
    assert "weight version   0" in tip
    assert page.inner_text("#weight-versions").strip() == "sampled by weight version 0"
    page.select_option("#colour-mode", "version")
    assert page.locator('#tokens .tok.policy[style*="background"]').count() == sum(rows[target]["response_mask"])
    page.select_option("#colour-mode", "drift")
    shot = shots / "viewer-episode.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 0

    page.goto(f"{viewer_url}/#/group/{rows[target]['step']}/{rows[target]['uid']}")
    page.wait_for_selector("#group .panel")
    assert page.locator("#group .panel").count() == sum(
        r["uid"] == rows[target]["uid"] and r["step"] == rows[target]["step"] for r in rows)

    page.goto(f"{viewer_url}/#/curves")  # two steps, no COMPLETE file: a live run
    page.wait_for_selector("#charts .chart svg")
    assert "live: refreshing every 5 s" in page.inner_text("#curves-status")
    assert page.locator('#charts .chart[data-key="reward/mean"] polyline.smooth').count() == 1
    assert "KL (actor/ppo_kl)" in page.inner_text("#curves-missing")  # the recorded run did no update
    page.screenshot(path=str(shots / "viewer-curves-two-steps.png"), full_page=True)
def _curves_run(run_dir: Path, steps: int = 200, test_freq: int = 20) -> Path:
    """A finished 200-step run's metrics.jsonl (written by MetricsLogger) and config.yaml: noisy rising reward,
    validation every `test_freq` steps, a drift that stays exactly 0 and a KL of a few 1e-4."""
    import yaml

    from agentrl.trainer.metrics import MetricsLogger
    from agentrl.trainer.resume import mark_complete

    rng = random.Random(0)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"trainer": {"val_n": 1, "val_temperature": 0.0, "test_freq": test_freq, "total_steps": steps}}))
    logger = MetricsLogger(run_dir, ["jsonl"])
    try:
        for step in range(0, steps + 1):
            learned = 0.45 * (1 - math.exp(-step / 60))
            metrics = {} if step == 0 else {
                "reward/mean": min(1.0, max(0.0, 0.3 + learned + rng.gauss(0, 0.08))),
                "reward/success_rate": min(1.0, max(0.0, 0.25 + learned + rng.gauss(0, 0.09))),
                "actor/ppo_kl": abs(3e-4 + rng.gauss(0, 1.5e-4)), "actor/kl": 0.004 * step / steps + 1e-4,
                "actor/entropy": 0.62 - 0.25 * step / steps + rng.gauss(0, 0.03),
                "episode/model_tokens_mean": 140 + 30 * math.sin(step / 25) + rng.gauss(0, 12),
                "episode/num_turns_mean": 2.0, "tools/calls_per_episode": 1.0 + rng.gauss(0, 0.05),
                "drift/abs_mean": 0.0, "timing/step_s": 31 + rng.gauss(0, 2), "timing/rollout_s": 19 + rng.gauss(0, 2),
                "timing/update_s": 9 + rng.gauss(0, 0.5)}
            if step % test_freq == 0:
                metrics.update({"val/reward/mean": 0.35 + learned, "val/reward/success_rate": 0.3 + learned,
                                "val/episode/model_tokens_mean": 150 + 10 * math.cos(step / 25)})
            logger.log(step, metrics)
    finally:
        logger.close()
    mark_complete(run_dir, steps)
    return run_dir


def _is_round_axis(labels: list[str]) -> bool:
    """Evenly spaced tick values whose step is 1, 2 or 5 times a power of ten."""
    values = [float(t.replace("k", "e3")) for t in labels]
    steps = {round(b - a, 12) for a, b in zip(values, values[1:])}
    if len(values) < 3 or len(set(labels)) != len(labels) or len({f"{s:.6g}" for s in steps}) != 1:
        return False
    mantissa = f"{steps.pop():e}".split("e")[0]
    return float(mantissa) in (1.0, 2.0, 5.0)


def test_curves_page_is_smoothed_labelled_and_marks_held_out(browser, tmp_path, shots):
    run_dir = _curves_run(tmp_path / "run")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    for url in _view(run_dir):
        page.goto(f"{url}/#/curves")
        page.wait_for_selector("#charts .chart svg")
        assert "run complete" in page.inner_text("#curves-status") and "live" not in page.inner_text("#curves-status")
        titles = page.locator("#charts .chart h4").all_inner_texts()
        assert [t.split(" · ")[0] for t in titles[:5]] == ["GRPO train reward", "GRPO success", "KL", "entropy",
                                                           "response length"]  # curves.png's panels, in its order
        success = page.locator('#charts .chart[data-key="reward/success_rate"]')
        assert success.locator("polyline.raw").count() == 1 and success.locator("polyline.smooth").count() == 1
        assert success.locator("g.held-out path").count() == 11  # step 0 and every 20 steps
        assert "held-out pass@1 (greedy, every 20 steps)" in success.inner_text()
        assert page.locator('#charts .chart[data-key="actor/ppo_kl"] polyline.smooth').count() == 2  # + actor/kl
        assert page.locator("#curves-missing").count() == 0  # this run logs every panel's metric
        for chart in page.locator("#charts .chart").all():
            key = chart.get_attribute("data-key")
            y_ticks = chart.locator("text.tick.y").all_text_contents()
            x_ticks = chart.locator("text.tick.x").all_text_contents()
            assert _is_round_axis(y_ticks), (key, y_ticks)
            assert _is_round_axis(x_ticks) and all(re.fullmatch(r"\d+", t) for t in x_ticks), (key, x_ticks)
        drift = page.locator('#charts .chart[data-key="drift/abs_mean"]')
        assert drift.locator("text.tick.y").all_text_contents()[0] == "0"  # a flat 0 on a readable axis
        assert "nats per token" in drift.inner_text()
        shot = shots / "viewer-curves.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")


def test_eval_directory_shows_its_report_and_comparison_without_training_terms(browser, recorded_eval, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    for url in _view(recorded_eval):
        page.goto(f"{url}/#/")
        page.wait_for_selector("#groups tr.episode-row")
        headers = page.locator("#groups th").all_inner_texts()
        assert "step" not in headers and "advantage" not in headers and "reward" in headers
        assert page.locator("input[name=step_min], input[name=zero_variance], .badge.zv").count() == 0
        assert page.inner_text("#curves-link") == "summary"
        page.screenshot(path=str(shots / "viewer-eval-episodes.png"), full_page=True)

        page.click("#groups tr.episode-row >> nth=0")
        page.wait_for_selector("#tokens .tok.policy")
        assert "advantage" not in page.inner_text("#app") and "step 0" not in page.inner_text("#app")

        page.click("#curves-link")
        page.wait_for_selector("#eval-compare table.report")
        assert "Evaluation: taught vs untaught" in page.inner_text("#eval-compare")
        header = page.locator("#eval-compare table.report >> nth=0").locator("tr >> nth=0").inner_text().split()
        assert header == ["metric", "taught", "untaught"]  # side by side
        rows = page.locator("#eval-compare table.report >> nth=0").locator("tr th:first-child").all_inner_texts()
        assert {"pass@1", "pass@2", "mean@n (success rate)", "tool error rate"} <= set(rows)
        page.click("details.panel > summary")  # the evaluation alone, as eval.md has it
        assert "Evaluation: taught" in page.inner_text("#eval-summary")
        assert "live" not in page.inner_text("#app") and "{" not in page.inner_text("#app")  # no JSON dump
        assert page.eval_on_selector("img.pass-at-k", "img => img.complete && img.naturalWidth > 0")
        shot = shots / "viewer-eval-summary.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
