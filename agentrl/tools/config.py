"""Tool configuration: which tool services to call and how (timeouts, limits, retries), plus in-process tools.

A tools YAML (`configs/tools/*.yaml`) and the `tools:` section of a training config have the same shape
(`ToolsConfig`). A training config either points at a tools YAML (`config: configs/tools/x.yaml`) or lists
services inline, or both (the file's services come first). In-process tools need no server at all:
`builtin: [calculator, lookup]` or `functions: ["my_pkg.tools:search"]`.

Per call: `timeout_s` bounds one attempt; an attempt that fails to connect, or gets 503/504, is retried up to
`retries` times with exponential backoff and jitter (503's Retry-After is honoured up to `max_backoff_s`).
So once the concurrency limits admit it, no call takes longer than
(retries + 1) * (timeout_s + connect_timeout_s) + retries * max_backoff_s (`ServiceConfig.call_budget_s`).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator

from agentrl.auth import bearer_headers
from agentrl.config import ConfigModel

BUILTIN_TOOLS = ("calculator", "lookup", "python")


class ServiceConfig(ConfigModel):
    url: str  # http://host:port of a tool service, or the MCP endpoint (e.g. http://host:port/mcp) for kind mcp
    name: str | None = None  # label in errors and metrics; default host:port
    kind: Literal["http", "mcp"] = "http"
    tools: list[str] | None = None  # serve only these of the service's tools (None: all)
    timeout_s: float = Field(30.0, gt=0)  # one attempt, connect included
    connect_timeout_s: float = Field(5.0, gt=0)
    max_concurrency: int = Field(64, ge=1)  # calls in flight to this service
    retries: int = Field(2, ge=0)  # extra attempts after a connection error, 503 or 504
    backoff_s: float = Field(0.1, ge=0)  # first backoff; doubles per retry, with jitter
    max_backoff_s: float = Field(5.0, gt=0)  # cap on one backoff, Retry-After included
    headers: dict[str, str] = Field(default_factory=dict)  # extra request headers
    token_file: str | None = None  # the service's token (its --token-file): sent as Authorization: Bearer <token>

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"tool service url {url!r} must look like http://host:port")
        return url.rstrip("/")

    @field_validator("tools")
    @classmethod
    def _not_empty(cls, tools: list[str] | None) -> list[str] | None:
        if tools is not None and not tools:
            raise ValueError("tools is an empty list; omit it to use every tool")
        return tools

    @model_validator(mode="after")
    def _default_name(self) -> ServiceConfig:
        if self.name is None:
            parsed = urlparse(self.url)
            self.name = parsed.netloc + (parsed.path if self.kind == "mcp" else "")
        if self.token_file and any(k.lower() == "authorization" for k in self.headers):
            raise ValueError("set either token_file or an Authorization header in headers, not both")
        return self

    def request_headers(self, key: str) -> dict[str, str]:
        """`headers` plus the bearer token of `token_file` (read now); `key` is where the service is configured,
        named if the file cannot be read."""
        return {**self.headers, **bearer_headers(self.token_file, field_key(key, "token_file"))}

    @property
    def call_budget_s(self) -> float:
        """The longest one call can take, retries and backoff included."""
        return (self.retries + 1) * (self.timeout_s + self.connect_timeout_s) + self.retries * self.max_backoff_s


class ToolsConfig(ConfigModel):
    config: str | None = None  # a tools YAML whose services/builtin/functions/tools_kwargs are added first
    services: list[ServiceConfig] = Field(default_factory=list)
    builtin: list[str] = Field(default_factory=list)  # in-process built-in tools: calculator, lookup, python
    functions: list[str] = Field(default_factory=list)  # in-process tools as "package.module:function"
    tools_kwargs: dict[str, dict] = Field(default_factory=dict)  # session defaults of in-process stateful tools
    max_concurrency: int = Field(256, ge=1)  # tool calls in flight over all services
    local_max_concurrency: int = Field(64, ge=1)  # in-process tool calls in flight
    local_timeout_s: float = Field(60.0, gt=0)  # one in-process call
    max_output_chars: int | None = Field(None, ge=1)  # hard cap on any tool output (middle truncation); None: no cap
    discovery_timeout_s: float = Field(10.0, gt=0)  # per service, at start

    @field_validator("builtin")
    @classmethod
    def _known_builtins(cls, builtin: list[str]) -> list[str]:
        unknown = [b for b in builtin if b not in BUILTIN_TOOLS]
        if unknown:
            raise ValueError(f"unknown builtin tool(s) {unknown}; available: {', '.join(BUILTIN_TOOLS)}")
        return builtin

    @field_validator("functions")
    @classmethod
    def _module_functions(cls, functions: list[str]) -> list[str]:
        for spec in functions:
            if ":" not in spec:
                raise ValueError(f"functions entry {spec!r} must look like 'package.module:function'")
        return functions

    @model_validator(mode="after")
    def _distinct_service_names(self) -> ToolsConfig:
        names = [s.name for s in self.services]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two services share the name(s) {dupes}; set a distinct `name:` on each")
        return self


def resolve_tools_config(cfg: ToolsConfig) -> ToolsConfig:
    """Fold `cfg.config` (a tools YAML) into `cfg`: its entries first, `cfg`'s limits win. Returns a new config."""
    return resolve_with_keys(cfg)[0]


def resolve_with_keys(cfg: ToolsConfig, prefix: str = "tools.", source: str | None = None,
                      ) -> tuple[ToolsConfig, list[str]]:
    """`resolve_tools_config(cfg)` plus, per resolved service, where it was configured, for errors to name:
    "services[0] in configs/tools/x.yaml" for a service of the referenced YAML, f"{prefix}services[i]" for one
    of `cfg`'s own (prefix "tools." in a training config, "" in a tools YAML), with " in {source}" if given."""
    where = f" in {source}" if source else ""
    own = [f"{prefix}services[{i}]{where}" for i in range(len(cfg.services))]
    if cfg.config is None:
        return cfg, own
    from agentrl.config import ConfigError, load_config

    base = load_config(ToolsConfig, cfg.config)
    if base.config is not None:
        raise ConfigError(f"{cfg.config}: a tools YAML referenced by `config:` cannot itself set `config:` "
                          f"({base.config!r}); list its services directly")
    merged = ToolsConfig(
        config=None,
        services=[*base.services, *cfg.services],
        builtin=list(dict.fromkeys([*base.builtin, *cfg.builtin])),
        functions=list(dict.fromkeys([*base.functions, *cfg.functions])),
        tools_kwargs={**base.tools_kwargs, **cfg.tools_kwargs},
        max_concurrency=cfg.max_concurrency,
        local_max_concurrency=cfg.local_max_concurrency,
        local_timeout_s=cfg.local_timeout_s,
        max_output_chars=cfg.max_output_chars,
        discovery_timeout_s=cfg.discovery_timeout_s,
    )
    return merged, [*(f"services[{i}] in {cfg.config}" for i in range(len(base.services))), *own]


def field_key(service_key: str, field: str) -> str:
    """The key of one field of a service: ("tools.services[0]", "url") -> "tools.services[0].url";
    ("services[1] in x.yaml", "url") -> "services[1].url in x.yaml"."""
    path, sep, source = service_key.partition(" in ")
    return f"{path}.{field}{sep}{source}"


__all__ = ["BUILTIN_TOOLS", "ServiceConfig", "ToolsConfig", "field_key", "resolve_tools_config", "resolve_with_keys"]
