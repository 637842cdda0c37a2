"""`ToolRegistry`: one place the agent loop finds tools, gets their schemas and calls them.

Tools live behind backends: in-process functions (`ToolSet`), HTTP tool services (`remote.HTTPToolService`)
and MCP servers (`mcp.MCPToolService`). The registry discovers every backend's schemas at `start()`, routes a
call by tool name, bounds concurrency globally (and each backend bounds its own), caps output size, and keeps
per-episode sessions: `episode_session(tools_kwargs)` yields a session id; the first call of a stateful tool
of a backend in that episode opens the backend's session, and leaving the block closes them all.

`call()` never raises for tool or infrastructure faults: the `ToolResult` says whose fault it was
(`result.infra_error`), so the trainer can drop infra-failed episodes instead of training them as reward 0.
Set-up problems (a service unreachable or answering garbage at `start()`, an unknown tool name in `schemas()`)
raise the user errors of `agentrl.tools.errors`, each one line naming the service, URL, config key and fix.
One registry lives in one event loop (it owns one pooled httpx client).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.tools.base import ToolResult
from agentrl.tools.builtin import builtin_tools
from agentrl.tools.config import ToolsConfig, field_key, resolve_with_keys
from agentrl.tools.errors import SessionOpenError, ToolServiceError, UnknownToolError
from agentrl.tools.limits import Limit
from agentrl.tools.mcp import MCPToolService
from agentrl.tools.remote import HTTPToolService
from agentrl.tools.toolset import ToolSet, UnknownSessionError
from agentrl.tools.transport import make_client
from agentrl.tools.truncate import truncate_text


class ToolBackend(Protocol):
    """Where a group of tools runs. `limit` is the registry's global semaphore, set before `discover()`."""

    name: str
    where: str  # e.g. "tool service 'calc' at http://127.0.0.1:8000", for errors
    key: str | None  # where it is configured, e.g. "tools.services[0]" (None: not from a config)
    call_budget_s: float  # the longest one admitted call may take, retries and backoff included

    async def discover(self, limit: Limit) -> list[dict]: ...  # OpenAI schemas; ToolServiceError
    def is_stateful(self, tool: str) -> bool: ...
    async def open_session(self, tools_kwargs: dict[str, dict]) -> str: ...  # raises SessionOpenError
    async def close_session(self, session_id: str) -> None: ...
    async def call(self, tool: str, arguments: Any, session_id: str | None) -> ToolResult: ...
    async def aclose(self) -> None: ...


class LocalBackend:
    """In-process tools (a `ToolSet`) with their own concurrency limit and per-call timeout."""

    def __init__(self, toolset: ToolSet, *, name: str = "local", max_concurrency: int = 64, timeout_s: float = 60.0):
        self.toolset = toolset
        self.name = name
        self.where = "the in-process tools"
        self.key = None
        self.timeout_s = timeout_s
        self.call_budget_s = timeout_s
        self._own = Limit(max_concurrency)
        self._global: Limit | None = None

    async def discover(self, limit: Limit) -> list[dict]:
        self._global = limit
        return self.toolset.schemas()

    def is_stateful(self, tool: str) -> bool:
        return self.toolset.tools[tool].stateful

    async def open_session(self, tools_kwargs: dict[str, dict]) -> str:
        try:
            return self.toolset.open_session(tools_kwargs)
        except ValueError as e:
            raise SessionOpenError(ToolResult.error("server_error", f"Error: bad tools_kwargs: {e}")) from None

    async def close_session(self, session_id: str) -> None:
        await self.toolset.close_session(session_id)

    async def call(self, tool: str, arguments: Any, session_id: str | None) -> ToolResult:
        # Own limit first: calls queued behind a saturated backend must not hold global slots meanwhile.
        async with self._own, self._global or contextlib.nullcontext():
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self.toolset.call(tool, arguments, session_id)
            except TimeoutError:
                return ToolResult.error("timeout", f"Error: tool '{tool}' did not finish within {self.timeout_s}s")
            except UnknownSessionError:
                return ToolResult.error("server_error", f"Error: session {session_id} of tool '{tool}' is closed")

    async def aclose(self) -> None:
        await self.toolset.aclose()


@dataclass
class _Episode:
    tools_kwargs: dict[str, dict]
    remote: dict[str, str] = field(default_factory=dict)  # backend name -> that backend's session id
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


class ToolRegistry:
    def __init__(self, backends: list[ToolBackend], *, subsets: dict[str, list[str] | None] | None = None,
                 max_concurrency: int = 256, max_output_chars: int | None = None, discovery_timeout_s: float = 10.0,
                 http_client: Any = None):
        names = [b.name for b in backends]
        if len(set(names)) != len(names):
            raise ToolServiceError(f"two tool services share a name: {names}: give each service a distinct `name:`")
        self.backends = list(backends)
        self.subsets = dict(subsets or {})
        self.max_concurrency = max_concurrency
        self.max_output_chars = max_output_chars
        self.discovery_timeout_s = discovery_timeout_s
        self.http_client = http_client  # owned: closed by aclose()
        self._limit = Limit(max_concurrency)
        self._routes: dict[str, ToolBackend] = {}
        self._schemas: dict[str, dict] = {}
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._episodes: dict[str, _Episode] = {}
        if all(isinstance(b, LocalBackend) for b in self.backends):  # nothing remote: usable without start()
            for b in self.backends:
                b._global = self._limit
                self._add_routes(b, b.toolset.schemas())
            self._started = True

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_functions(cls, fns: list[Callable], *, tools_kwargs: dict[str, dict] | None = None,
                       max_concurrency: int = 64, timeout_s: float = 60.0,
                       max_output_chars: int | None = None) -> ToolRegistry:
        """In-process tools (plain typed functions or `@tool`s); ready to use without `start()`."""
        backend = LocalBackend(ToolSet(fns, defaults=tools_kwargs), max_concurrency=max_concurrency,
                               timeout_s=timeout_s)
        return cls([backend], max_concurrency=max_concurrency, max_output_chars=max_output_chars)

    @classmethod
    def from_config(cls, path_or_dict: str | Path | dict | ToolsConfig) -> ToolRegistry:
        """From a tools YAML path, a dict of the same shape, or a `ToolsConfig`."""
        from agentrl.config import load_config

        if isinstance(path_or_dict, ToolsConfig):
            return cls.from_tools_config(path_or_dict, key_prefix="")
        if isinstance(path_or_dict, dict):
            return cls.from_tools_config(load_config(ToolsConfig, data=path_or_dict), key_prefix="")
        return cls.from_tools_config(load_config(ToolsConfig, path_or_dict), key_prefix="", source=str(path_or_dict))

    @classmethod
    def from_tools_config(cls, cfg: ToolsConfig, *, key_prefix: str = "tools.",
                          source: str | None = None) -> ToolRegistry:
        """From a `ToolsConfig`. Set-up errors name a service by its key: `key_prefix` is where the config sits
        ("tools." in a training config: tools.services[0].url), `source` the file it came from."""
        from agentrl.config import import_object

        cfg, keys = resolve_with_keys(cfg, key_prefix, source)
        backends: list[Any] = []
        local = [*builtin_tools(cfg.builtin),
                 *(import_object(spec, "tools.functions") for spec in cfg.functions)]
        if local:
            backends.append(LocalBackend(ToolSet(local, defaults=cfg.tools_kwargs), timeout_s=cfg.local_timeout_s,
                                         max_concurrency=cfg.local_max_concurrency))
        elif cfg.tools_kwargs:
            raise ToolServiceError(f"tools_kwargs {sorted(cfg.tools_kwargs)} given but no in-process tools "
                                   f"(builtin/functions) to use them; a tool service takes its defaults itself")
        client = transport = None
        if any(s.kind == "http" for s in cfg.services):
            client, transport = make_client(cfg.max_concurrency)
        for service, service_key in zip(cfg.services, keys):
            if service.kind == "http":
                backends.append(HTTPToolService(service, client, transport, key=service_key))
            else:
                backends.append(MCPToolService(service, key=service_key))
        return cls(backends, subsets={s.name: s.tools for s in cfg.services}, max_concurrency=cfg.max_concurrency,
                   max_output_chars=cfg.max_output_chars, discovery_timeout_s=cfg.discovery_timeout_s,
                   http_client=client)

    # -- discovery ------------------------------------------------------------------------------------------------
    def _add_routes(self, backend: ToolBackend, schemas: list[dict]) -> None:
        offered = {s["function"]["name"]: s for s in schemas}
        wanted = self.subsets.get(backend.name)
        if wanted is not None:
            missing = [n for n in wanted if n not in offered]
            if missing:
                listed = field_key(backend.key, "tools") if backend.key else "its `tools:` list"
                raise ToolServiceError(f"{backend.where} does not serve {missing} named in {listed}; it serves: "
                                       f"{', '.join(offered) or 'nothing'}: fix the list or serve those tools there")
            offered = {n: offered[n] for n in wanted}
        for tool_name, schema in offered.items():
            if tool_name in self._routes:
                raise ToolServiceError(f"tool {tool_name!r} is served by both {self._routes[tool_name].where} and "
                                       f"{backend.where}: list the tools to use from one of them in its `tools: "
                                       f"[...]`")
            self._routes[tool_name] = backend
            self._schemas[tool_name] = schema

    async def start(self) -> None:
        """Discover every backend's tools (idempotent). Raises ToolServiceError naming a failing service."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return

            async def one(backend: ToolBackend) -> list[dict]:
                try:
                    async with asyncio.timeout(self.discovery_timeout_s):
                        return await backend.discover(self._limit)
                except TimeoutError:
                    raise ToolServiceError(f"{backend.where} did not list its tools within "
                                           f"{self.discovery_timeout_s}s: check that it is running and not stuck, "
                                           f"or raise tools.discovery_timeout_s") from None

            found = await asyncio.gather(*(one(b) for b in self.backends))
            for backend, schemas in zip(self.backends, found):
                self._add_routes(backend, schemas)
            self._started = True

    def names(self) -> list[str]:
        self._require_started()
        return list(self._routes)

    def service_of(self, name: str) -> str:
        """The name of the backend serving tool `name` ("local" for in-process tools)."""
        self._require_started()
        if name not in self._routes:
            raise UnknownToolError(f"tool {name!r} is not served by any configured tool service; available: "
                                   f"{', '.join(self._routes) or 'none'}: fix the tool name or the tools config")
        return self._routes[name].name

    def schemas(self, names: list[str] | None = None) -> list[dict]:
        """OpenAI function schemas of `names` (all tools when None), in the order asked."""
        self._require_started()
        if names is None:
            return list(self._schemas.values())
        unknown = [n for n in names if n not in self._schemas]
        if unknown:
            raise UnknownToolError(f"tools {unknown} are not served by any configured tool service; available: "
                                   f"{', '.join(self._schemas) or 'none'}: fix the tool names or the tools config")
        return [self._schemas[n] for n in names]

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("the tool registry has remote services whose tools are not discovered yet: "
                               "`await registry.start()` first (in-process-only registries need no start)")

    # -- sessions -------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def episode_session(self, tools_kwargs: dict[str, dict] | None = None) -> AsyncIterator[str]:
        """Yield a session id for `call(..., session=...)`; backend sessions open lazily and close on exit."""
        await self.start()
        session_id = uuid.uuid4().hex
        episode = _Episode(tools_kwargs=dict(tools_kwargs or {}))
        self._episodes[session_id] = episode
        try:
            yield session_id
        finally:
            self._episodes.pop(session_id, None)
            if episode.remote:
                by_name = {b.name: b for b in self.backends}
                closing = asyncio.gather(*(by_name[b].close_session(sid) for b, sid in episode.remote.items()),
                                         return_exceptions=True)
                # Closing must finish even if the episode task is cancelled meanwhile (episode timeout): the
                # shield lets it run on while the cancellation still reaches the caller.
                await asyncio.shield(closing)

    async def _backend_session(self, episode: _Episode, backend: ToolBackend) -> str:
        lock = episode.locks.setdefault(backend.name, asyncio.Lock())
        async with lock:
            if backend.name not in episode.remote:
                mine = {t: kw for t, kw in episode.tools_kwargs.items() if self._routes.get(t) is backend}
                episode.remote[backend.name] = await backend.open_session(mine)
            return episode.remote[backend.name]

    # -- calls ----------------------------------------------------------------------------------------------------
    async def call(self, name: str, arguments: Any, session: str | None = None) -> ToolResult:
        """Call tool `name`; tool and infrastructure faults come back as an error ToolResult, never raised."""
        start = time.perf_counter()
        await self.start()
        backend = self._routes.get(name)
        if backend is None:
            result = ToolResult.error("unknown_tool", f"Error: unknown tool '{name}'. Available tools: "
                                                      f"{', '.join(self._routes) or 'none'}.")
        else:
            result = await self._call(backend, name, arguments, session)
            result.metrics.setdefault("service", backend.name)
        if self.max_output_chars is not None:
            result.content, cut = truncate_text(result.content, max_chars=self.max_output_chars)
            if cut:
                result.metrics["truncated_chars"] = True
        result.latency_s = time.perf_counter() - start
        return result

    async def _call(self, backend: ToolBackend, name: str, arguments: Any, session: str | None) -> ToolResult:
        backend_session = None
        if session is not None and backend.is_stateful(name):
            episode = self._episodes.get(session)
            if episode is None:
                raise ValueError(f"tool session {session!r} is not open: use `async with registry.episode_session()"
                                 f" as session:` and call inside the block")
            try:
                backend_session = await self._backend_session(episode, backend)
            except SessionOpenError as e:
                return e.result
        # Backends bound every attempt once it holds its concurrency slots (time queued behind the limits is
        # the client's own backlog, not a sick service, so it does not count as a timeout).
        return await backend.call(name, arguments, backend_session)

    async def aclose(self) -> None:
        await asyncio.gather(*(b.aclose() for b in self.backends), return_exceptions=True)
        if self.http_client is not None:
            await self.http_client.aclose()

    async def __aenter__(self) -> ToolRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["LocalBackend", "ToolBackend", "ToolRegistry"]
