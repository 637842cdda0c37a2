"""A minimal OpenEnv environment server built with openenv-core's server package (`create_app`), for the openenv
adapter's test: each step echoes the message, rewards 0.1 per character, and the episode ends after 2 steps.

    python -m uvicorn openenv_echo_server:app --host 127.0.0.1 --port PORT
"""

from __future__ import annotations

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

MAX_STEPS = 2


class EchoAction(Action):
    message: str = Field(..., description="what to echo")


class EchoObservation(Observation):
    echoed_message: str = Field(default="")


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=f"Say anything (seed {seed}).", done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(echoed_message=f"You said: {action.message}", reward=0.1 * len(action.message),
                               done=self._state.step_count >= MAX_STEPS)

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=8)
