"""Errors of the tools package, in one module every other tools module may import (it imports none of them).

Two families, kept apart on purpose:

- Set-up errors a user causes and fixes (a tool service that is unreachable or answers garbage at discovery, a
  tool the registry does not serve, a function that cannot be a tool): subclasses of `agentrl.errors.UserError`
  with a one-line message naming the service, URL, tool or function and the fix. They are raised before any
  rollout starts, and the `agentrl` command shows them as `error: ...` (exit 2).
- Faults of a tool *call* during rollouts are never raised: `ToolRegistry.call` returns a `ToolResult` whose
  `error_kind` says whose fault it was (policy or infrastructure), so a service that dies mid-training marks the
  episode `infra_error` instead of crashing the run. `SessionOpenError` carries such a result internally.
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import UserError


class ToolServiceError(UserError):
    """A tool backend cannot be set up: unreachable at discovery, invalid answers, name clashes, missing tools."""


class UnknownToolError(ToolServiceError, KeyError):
    """Schemas or a service were asked for a tool the registry does not serve (also a KeyError)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ToolDefinitionError(UserError, TypeError):
    """A function cannot become a tool (a parameter without a type hint, `*args`, a misdeclared session)."""


class ToolSpecError(UserError, ValueError):
    """Tools are misnamed: a `module:fn` spec that imports nothing, two tools of one name, session defaults
    (`--tool-kwargs`, `tools_kwargs`) for a tool that is not there."""


class SessionOpenError(Exception):
    """A backend could not open a session; `result` is the infra ToolResult to hand back for the call."""

    def __init__(self, result: Any):  # a ToolResult (not imported: base.py imports this module)
        super().__init__(result.content)
        self.result = result


__all__ = ["SessionOpenError", "ToolDefinitionError", "ToolServiceError", "ToolSpecError", "UnknownToolError"]
