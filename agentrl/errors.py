"""Errors a user can cause and fix, shown as one line by the `agentrl` command.

A `UserError` says what was wrong, where (file, row, key, tool, URL, port) and what to do, in one line. The
command prints `error: <message>` on stderr and exits with code 2, without a traceback; `AGENTRL_DEBUG=1` shows the
traceback too. Anything else that escapes a command is a bug and keeps its traceback.

Modules raise the most specific subclass they own (e.g. `TaskFormatError`, `ConfigError`) and subclass
`UserError` so the command line can tell a user's mistake from a fault of agentrl itself.

`InfraFailureError` is the other one-line stop: a service the run depends on (a tool service, the sandbox, an
engine) kept failing, so the run stopped on its own, or a trainer rank died (`RankDiedError`); the command exits
with code 3 (`EXIT_INFRA`). Exit codes:
0 done, 1 a crash (a bug: traceback), 2 a user error (`EXIT_USER`), 3 an infrastructure stop, 130 interrupted.
"""

from __future__ import annotations

import os

EXIT_USER = 2
EXIT_INFRA = 3


class UserError(Exception):
    """A mistake in the user's input (config, data, paths, arguments, services); the message is one line."""


class InfraFailureError(Exception):
    """A run stopped because its infrastructure (tool services, sandbox, engines) failed too often; the message is
    one line naming the service, its URL and what failed. Running the same command again resumes the run."""


class RankDiedError(Exception):
    """A trainer rank's process died during a call (killed, out of memory, its node lost); one line naming the
    rank and its node, exit code 3 as an infrastructure stop. Not an `InfraFailureError`: that stop saves a
    checkpoint first, which the group's dead ranks cannot write; the run resumes from its last checkpoint."""

    def __init__(self, message: str, *, rank: int, node: str):
        super().__init__(message)
        self.rank, self.node = rank, node


class WeightSyncError(InfraFailureError):
    """A weight push to the engine failed (a server refused or lost the update); raised after the step's update,
    so the run stops with that step saved."""


class WeightSyncTimeoutError(WeightSyncError):
    """A weight push to the engine did not finish within `trainer.weight_sync_timeout_s`."""


def debug_enabled() -> bool:
    """`AGENTRL_DEBUG=1` (or any non-empty value but 0) shows tracebacks for user errors too."""
    return os.environ.get("AGENTRL_DEBUG", "") not in ("", "0")


def one_line(message: str) -> str:
    """Fold a message onto one line (a user error is a line on stderr, never a paragraph)."""
    return " ".join(str(message).split())


__all__ = ["EXIT_INFRA", "EXIT_USER", "InfraFailureError", "RankDiedError", "UserError", "WeightSyncError",
           "WeightSyncTimeoutError",
           "debug_enabled", "one_line"]
