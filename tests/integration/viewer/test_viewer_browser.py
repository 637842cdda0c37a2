"""`agentrl view` in a real browser: headless Chromium (the system's, driven by Playwright) opens the page of a
real small run, goes to an episode and counts the tokens coloured as policy. The screenshots are test artifacts:
they are kept in `test-artifacts/viewer/` at the repository root (or under $AGENTRL_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def viewer_url(recorded_run):
    run_dir, _ = recorded_run
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["python", "-m", "agentrl.cli", "view", str(run_dir), "--port", str(port)], f"{url}/api/run"):
        yield url


def test_episode_page_colours_exactly_the_policy_tokens(browser, viewer_url, recorded_run):
    run_dir, _ = recorded_run
    shots = ARTIFACTS / "viewer"
    shots.mkdir(parents=True, exist_ok=True)
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
    page.select_option("#colour-mode", "drift")
    shot = shots / "viewer-episode.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 0

    page.goto(f"{viewer_url}/#/group/{rows[target]['step']}/{rows[target]['uid']}")
    page.wait_for_selector("#group .panel")
    assert page.locator("#group .panel").count() == sum(
        r["uid"] == rows[target]["uid"] and r["step"] == rows[target]["step"] for r in rows)

    page.goto(f"{viewer_url}/#/curves")
    page.wait_for_selector("#charts .chart")
    assert page.locator('#charts .chart[data-key^="reward (reward/mean)"] polyline').count() == 1
    page.screenshot(path=str(shots / "viewer-curves.png"), full_page=True)
