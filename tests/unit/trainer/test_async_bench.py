"""`agentrl bench async`'s table from synthetic per-step metrics, and its seeded tool latencies (no timing)."""

from __future__ import annotations

from agentrl.trainer.async_bench import call_latency_s, format_table, summarize


def _step(step_s: float, **extra: float) -> dict:
    return {"timing/step_s": step_s, **extra}


def test_rows_take_wall_idle_and_staleness_from_metrics_and_ratio_is_over_sync():
    sync = summarize("sync", None, [_step(10.0, **{"timing/rollout_s": 6.0}), _step(10.0, **{"timing/rollout_s": 8.0})])
    fast = summarize("async", 2, [
        _step(4.0, **{"async/trainer_wait_s": 1.0, "async/engine_wait_s": 0.5, "data/stale_groups_dropped": 1.0,
                      "rollout/staleness_mean": 0.5, "rollout/tool_calls_per_episode": 2.0}),
        _step(6.0, **{"async/trainer_wait_s": 1.0, "async/engine_wait_s": 0.5, "data/stale_groups_dropped": 2.0,
                      "rollout/staleness_mean": 1.5, "rollout/tool_calls_per_episode": 1.0})])
    assert sync["wall_s"] == 20.0 and sync["steps_per_hour"] == 360.0
    assert (sync["trainer_idle"], round(sync["engine_idle"], 6)) == (0.7, 0.3)  # waits on the rollout / the update
    assert fast["wall_s"] == 10.0 and fast["steps_per_hour"] == 720.0
    assert (fast["trainer_idle"], fast["engine_idle"]) == (0.2, 0.1)
    assert (fast["stale_groups_dropped"], fast["staleness_mean"], fast["tool_calls_per_episode"]) == (3, 1.0, 1.5)
    header, sync_line, async_line = format_table([sync, fast]).splitlines()
    assert header.split()[:6] == ["mode", "k", "steps", "wall", "s", "steps/hour"]
    assert sync_line.split()[:6] == ["sync", "-", "2", "20.0", "360", "1.00x"]
    assert async_line.split() == ["async", "2", "2", "10.0", "720", "2.00x", "0.20", "0.10", "3", "1.00", "1.50"]


def test_a_side_without_staleness_metrics_shows_a_dash():
    row = summarize("async", 0, [_step(5.0)])
    assert row["staleness_mean"] is None
    assert format_table([summarize("sync", None, [_step(5.0)]), row]).splitlines()[2].split()[9] == "-"


def test_long_tail_latencies_are_the_same_for_every_side_and_about_one_call_in_ten():
    first = [call_latency_s(i, 300, long_tail_seed=0) for i in range(1000)]
    assert first == [call_latency_s(i, 300, long_tail_seed=0) for i in range(1000)]
    assert set(first) == {0.3, 3.0}
    assert 60 <= first.count(3.0) <= 140
    assert {call_latency_s(i, 300, long_tail_seed=None) for i in range(100)} == {0.3}


def test_sides_share_model_budget_and_overrides_and_only_async_sides_get_their_own(tmp_path):
    import argparse

    from agentrl.trainer.async_bench import add_arguments, side_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--set", "actor.lr=2e-4", "--async-set", "actor.num_threads_per_worker=1"])
    sides = {k: side_config(args, tmp_path / "model", tmp_path / "tasks.jsonl", tmp_path / f"run{k}",
                            "http://127.0.0.1:1", k) for k in (None, 2)}
    sync, asynchronous = sides[None], sides[2]
    assert sync.trainer.mode == "sync" and asynchronous.trainer.mode == "async"
    assert asynchronous.trainer.max_staleness == 2 and asynchronous.algorithm.rollout_correction.level == "token"
    assert sync.algorithm.rollout_correction.level is None
    assert sync.actor.lr == asynchronous.actor.lr == 2e-4
    assert sync.engine.num_threads == asynchronous.engine.num_threads == 1
    assert sync.actor.num_threads_per_worker is None and asynchronous.actor.num_threads_per_worker == 1
    assert (sync.data.train_batch_size, sync.rollout.n) == (asynchronous.data.train_batch_size,
                                                              asynchronous.rollout.n) == (8, 8)
