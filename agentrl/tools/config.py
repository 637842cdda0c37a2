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

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

BUILTIN_TOOLS = ("calculator", "lookup", "python")


@dataclass
class ServiceConfig:
    url: str  # http://host:port of a tool service, or the MCP endpoint (e.g. http://host:port/mcp) for kind mcp
    name: str | None = None  # label in errors and metrics; default host:port
    kind: Literal["http", "mcp"] = "http"
    tools: list[str] | None = None  # serve only these of the service's tools (None: all)
    timeout_s: float = 30.0  # one attempt, connect included
    connect_timeout_s: float = 5.0
    max_concurrency: int = 64  # calls in flight to this service
    retries: int = 2  # extra attempts after a connection error, 503 or 504
    backoff_s: float = 0.1  # first backoff; doubles per retry, with jitter
    max_backoff_s: float = 5.0  # cap on one backoff, Retry-After included
    headers: dict[str, str] = field(default_factory=dict)  # e.g. an Authorization header

    def __post_init__(self) -> None:
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"tool service url {self.url!r} must look like http://host:port")
        self.url = self.url.rstrip("/")
        if self.name is None:
            self.name = parsed.netloc + (parsed.path if self.kind == "mcp" else "")
        for key in ("timeout_s", "connect_timeout_s", "max_backoff_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"service {self.name}: {key} must be > 0, got {getattr(self, key)}")
        if self.backoff_s < 0:
            raise ValueError(f"service {self.name}: backoff_s must be >= 0, got {self.backoff_s}")
        if self.max_concurrency < 1:
            raise ValueError(f"service {self.name}: max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.retries < 0:
            raise ValueError(f"service {self.name}: retries must be >= 0, got {self.retries}")
        if self.tools is not None and not self.tools:
            raise ValueError(f"service {self.name}: tools is an empty list; omit it to use every tool")

    @property
    def call_budget_s(self) -> float:
        """The longest one call can take, retries and backoff included."""
        return (self.retries + 1) * (self.timeout_s + self.connect_timeout_s) + self.retries * self.max_backoff_s


@dataclass
class ToolsConfig:
    config: str | None = None  # a tools YAML whose services/builtin/functions/tools_kwargs are added first
    services: list[ServiceConfig] = field(default_factory=list)
    builtin: list[str] = field(default_factory=list)  # in-process built-in tools: calculator, lookup, python
    functions: list[str] = field(default_factory=list)  # in-process tools as "package.module:function"
    tools_kwargs: dict[str, dict] = field(default_factory=dict)  # session defaults of in-process stateful tools
    max_concurrency: int = 256  # tool calls in flight over all services
    local_max_concurrency: int = 64  # in-process tool calls in flight
    local_timeout_s: float = 60.0  # one in-process call
    max_output_chars: int | None = None  # hard cap on any tool output (middle truncation); None: no cap
    discovery_timeout_s: float = 10.0  # per service, at start

    def __post_init__(self) -> None:
        unknown = [b for b in self.builtin if b not in BUILTIN_TOOLS]
        if unknown:
            raise ValueError(f"unknown builtin tool(s) {unknown}; available: {', '.join(BUILTIN_TOOLS)}")
        for spec in self.functions:
            if ":" not in spec:
                raise ValueError(f"functions entry {spec!r} must look like 'package.module:function'")
        for key in ("max_concurrency", "local_max_concurrency"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("local_timeout_s", "discovery_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")
        if self.max_output_chars is not None and self.max_output_chars < 1:
            raise ValueError(f"max_output_chars must be >= 1 or null, got {self.max_output_chars}")
        names = [s.name for s in self.services]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two services share the name(s) {dupes}; set a distinct `name:` on each")


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
