"""Environments: what answers a model's turns when a task names an `env` (agentrl/envs/base.py); the loop that
drives them is `agentrl.envs.loop.EnvAgentLoop`."""

from agentrl.envs.base import BUILTIN_ENVS, Env, StepResult, UnknownEnvError, make_env

__all__ = ["BUILTIN_ENVS", "Env", "StepResult", "UnknownEnvError", "make_env"]
