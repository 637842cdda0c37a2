"""When a run stops on its own: the infrastructure rule on hand-made counts, the line naming the service, URL and
what failed, the traceback in train.log, and the exit codes of `agentrl`."""

from __future__ import annotations

import argparse

import pytest

import agentrl.cli
from agentrl.agent_loop.rewards import RewardError
from agentrl.errors import InfraFailureError
from agentrl.trainer.stops import InfraLimits, InfraWatch, infra_cause, infra_stop_rule, log_failure, resume_hint
from agentrl.types import Episode, Task

DEFAULT = InfraLimits(max_fraction=0.5, streak_fraction=0.25, streak_steps=3)
ONE_STEP = "more than trainer.max_infra_failed_fraction=0.5"
STREAK = "more than trainer.infra_streak_fraction=0.25 for trainer.infra_streak_steps=3 steps in a row"


@pytest.mark.parametrize("counts,rule", [
    ([(0, 64)], None),
    ([(32, 64)], None),  # exactly half: not more than half
    ([(33, 64)], ONE_STEP),
    ([(0, 64), (64, 64)], ONE_STEP),  # a dead service stops the run at its first step
    ([(17, 64), (17, 64)], None),  # two steps above 25% are not yet a streak
    ([(17, 64), (17, 64), (17, 64)], STREAK),
    ([(17, 64), (16, 64), (17, 64), (17, 64)], None),  # 16/64 is not above 25%: the streak restarted
    ([(17, 64), (16, 64), (17, 64), (17, 64), (20, 64)], STREAK),
])
def test_the_default_rule(counts, rule):
    assert infra_stop_rule(counts, DEFAULT) == rule


def test_the_rule_can_be_turned_off():
    assert infra_stop_rule([(64, 64)], InfraLimits(1.0, 0.25, 0)) is None
    assert infra_stop_rule([(17, 64)] * 10, InfraLimits(1.0, 0.25, 0)) is None
    assert infra_stop_rule([(1, 64)], InfraLimits(0.0, 0.25, 0)) == "more than trainer.max_infra_failed_fraction=0"


def episode(infra: bool, calls: list[dict] | None = None, finish: str | None = None, **metrics) -> Episode:
    return Episode(uid="u", prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1.0],
                   messages=[], infra_error=infra, tool_calls=calls or [], metrics=metrics,
                   finish_reason=finish or ("infra_error" if infra else "stop"))


def unreachable_call(service: str = "calc") -> dict:
    """A tool_calls record as the agent loop writes it for a call the registry could not deliver."""
    return {"turn": 0, "call_id": "c0", "name": "calculator", "arguments": {}, "ok": False, "error_kind": "unreachable",
            "latency_s": 0.1, "truncated": False, "metrics": {"service": service, "attempts": 3},
            "response": {"content": f"Error: tool service {service} is unreachable (ConnectError)", "is_error": True,
                         "error_kind": "unreachable", "metrics": {"service": service}}}


SERVICES = {"calc": "tool service 'calc' at http://127.0.0.1:8123"}


def test_the_cause_names_the_service_its_url_and_what_failed():
    episodes = [episode(True, [unreachable_call()]) for _ in range(3)] + [episode(False)]
    assert infra_cause(episodes, SERVICES) == (
        "tool service 'calc' at http://127.0.0.1:8123 failed calls to tool 'calculator' (unreachable): "
        "Error: tool service calc is unreachable (ConnectError)")
    mixed = episodes + [episode(True, infra_detail="engine: server at http://127.0.0.1:30000 answered HTTP 502")]
    assert infra_cause(mixed, SERVICES).endswith("(ConnectError) in 3 of them")
    assert infra_cause([episode(True, infra_detail="sandbox (unreachable): sandbox http://127.0.0.1:8080 "
                                                   "unreachable: ConnectError('')")], SERVICES) == \
        "sandbox (unreachable): sandbox http://127.0.0.1:8080 unreachable: ConnectError('')"
    assert infra_cause([episode(True, finish="timeout", stop_detail="episode_timeout", timeout_phase="tools")],
                       SERVICES) == "episodes ran past agent.episode_timeout_s (waiting for the tools)"


def test_the_watch_stops_at_the_third_step_above_a_quarter(tmp_path):
    watch = InfraWatch(DEFAULT, SERVICES)
    step = [episode(True, [unreachable_call()])] + [episode(False)] * 2  # 1 of 3 failed: above 25%, below 50%
    watch.check(1, step)
    watch.check(2, step)
    with pytest.raises(InfraFailureError) as raised:
        watch.check(3, step)
    assert str(raised.value) == (f"step 3: 1 of 3 episodes failed for an infrastructure reason, {STREAK}: tool "
                                 "service 'calc' at http://127.0.0.1:8123 failed calls to tool 'calculator' "
                                 "(unreachable): Error: tool service calc is unreachable (ConnectError)")
    hinted = resume_hint(raised.value, 2, tmp_path, auto=True)
    assert str(hinted).endswith("; bring the service back and run the same command again: it resumes after step 2 "
                                f"(traceback in {tmp_path / 'train.log'})")
    assert "run the command again with trainer.resume=auto: it starts over (no step was completed)" in \
        str(resume_hint(raised.value, None, tmp_path, auto=False))


def test_the_traceback_goes_to_train_log_and_a_reward_error_learns_its_row(tmp_path):
    t = Task(prompt=[], task_id="calc-3")
    try:
        try:
            {}["answer"]
        except KeyError as e:
            raise RewardError("'my_rewards:score'", t, e) from e
    except RewardError as e:
        log_failure(tmp_path, e, [(Task(prompt=[], task_id="calc-3"), "elsewhere"), (t, "data/train.jsonl:row 4")])
        error = e
    assert "on task 'calc-3' (data/train.jsonl:row 4); fix the reward function (traceback in " \
           f"{tmp_path / 'train.log'})" in str(error)
    log = (tmp_path / "train.log").read_text()
    assert "stopped: RewardError: reward 'my_rewards:score' raised KeyError: 'answer'" in log
    assert "Traceback (most recent call last)" in log and '{}["answer"]' in log


def run_cli(monkeypatch, capsys, error: Exception) -> tuple[int, list[str]]:
    """`agentrl go` whose handler raises `error`: the exit code and stderr's lines."""
    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="agentrl")
        sub = p.add_subparsers()
        go = sub.add_parser("go")
        go.set_defaults(func=lambda args: (_ for _ in ()).throw(error))
        return p

    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    monkeypatch.setattr(agentrl.cli, "build_parser", parser)
    code = agentrl.cli.main(["go"])
    return code, capsys.readouterr().err.splitlines()


def test_exit_codes(monkeypatch, capsys):
    code, err = run_cli(monkeypatch, capsys, InfraFailureError("step 3: 8 of 8 episodes failed\nfor a reason"))
    assert (code, err) == (3, ["error: step 3: 8 of 8 episodes failed for a reason"])
    try:
        raise KeyError("answer")
    except KeyError as e:
        reward_error = RewardError("'m:f'", Task(prompt=[], task_id="t"), e)
    code, err = run_cli(monkeypatch, capsys, reward_error)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: reward 'm:f' raised KeyError: 'answer'")
