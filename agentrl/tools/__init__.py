"""Tools as HTTP services: define (`@tool`), serve (`agentrl tools serve`), discover and call (`ToolRegistry`)."""

from agentrl.tools.base import (
    ERROR_KINDS,
    INFRA_ERROR_KINDS,
    POLICY_ERROR_KINDS,
    Tool,
    ToolError,
    ToolInfraError,
    ToolResult,
    tool,
)
from agentrl.tools.client import ToolRegistry
from agentrl.tools.config import ServiceConfig, ToolsConfig
from agentrl.tools.errors import ToolDefinitionError, ToolServiceError, UnknownToolError
from agentrl.tools.truncate import truncate_text

__all__ = [
    "ERROR_KINDS",
    "INFRA_ERROR_KINDS",
    "POLICY_ERROR_KINDS",
    "ServiceConfig",
    "Tool",
    "ToolDefinitionError",
    "ToolError",
    "ToolInfraError",
    "ToolRegistry",
    "ToolResult",
    "ToolServiceError",
    "ToolsConfig",
    "UnknownToolError",
    "tool",
    "truncate_text",
]
