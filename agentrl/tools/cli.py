"""`agentrl tools serve SPEC... --port N` and `agentrl tools list --config tools.yaml`.

SPEC names the functions to serve: `package.module:fn1,fn2` or `path/to/file.py:fn1,fn2`. Functions that are
not `@tool`s yet are wrapped with default options.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from agentrl.auth import TOKEN_HELP
from agentrl.tools.errors import ToolSpecError

SERVE_DESCRIPTION = """\
Serve typed Python functions (or @tools) as an HTTP tool service. Each parameter needs a type hint: the
hints and the Google-style docstring become the tool's JSON schema. It prints "tool service ready on URL"
on stderr once it accepts calls.

Routes:
  GET  /tools          the OpenAI function schemas of the tools
  POST /tools/NAME     call one tool; JSON body:
                         {"arguments": {...}, "session_id": "..."}
                       "arguments" (required): the tool's arguments as a JSON object, per its schema
                       "session_id" (optional): an id from POST /sessions, for stateful tools
                       answers {"content": str, "is_error": bool, "error_kind": str?, "metrics": {}?};
                       a body without "arguments" (or not a JSON object) is a 400 saying so
  POST /sessions       {"tools_kwargs": {tool: {...}}} -> {"session_id": ...}; DELETE /sessions/ID closes it
  GET  /health         status, tools, stateful tools, open sessions, calls in flight

With --token-file (or $AGENTRL_SERVICE_TOKEN) every route but /health needs "Authorization: Bearer TOKEN";
a --host other than loopback refuses to start without a token.

Example:
  agentrl tools serve agentrl.tools.builtin.calculator:calculator --port 8000
  curl -s localhost:8000/tools/calculator -d '{"arguments": {"expression": "6*7"}}'
"""


def load_tool_spec(spec: str) -> list[Any]:
    """The functions named by `module:fn1,fn2` or `file.py:fn1,fn2`; errors name the missing piece."""
    if ":" not in spec:
        raise ToolSpecError(f"tool spec {spec!r} must look like package.module:fn1,fn2 or path/to/file.py:fn1")
    where, names = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ToolSpecError(f"tool spec {spec!r}: file {path} does not exist")
        module_name = f"_agentrl_tools_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ToolSpecError(f"tool spec {spec!r}: cannot import {where!r} ({e})") from None
    out = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if not hasattr(module, name):
            public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            raise ToolSpecError(f"tool spec {spec!r}: {where} has no {name!r}; it defines: {', '.join(public)}")
        out.append(getattr(module, name))
    if not out:
        raise ToolSpecError(f"tool spec {spec!r} names no function after the ':'")
    return out


def _serve(args: argparse.Namespace) -> int:
    from agentrl.auth import service_token
    from agentrl.tools.service import serve

    token = service_token(args.host, args.token_file, "agentrl tools serve")  # before importing any tool
    tools = [t for spec in args.specs for t in load_tool_spec(spec)]
    try:
        defaults = json.loads(args.tool_kwargs) if args.tool_kwargs else None
    except json.JSONDecodeError as e:
        raise ToolSpecError(f"--tool-kwargs is not valid JSON ({e.msg}); e.g. '{{\"lookup\": {{\"kb_path\": "
                         f"\"kb.jsonl\"}}}}'") from None
    serve(tools, host=args.host, port=args.port, defaults=defaults, max_concurrency=args.max_concurrency,
          idle_ttl_s=args.idle_ttl_s, log_level=args.log_level, token=token)
    return 0


def _list(args: argparse.Namespace) -> int:
    import asyncio

    from agentrl.tools.client import ToolRegistry

    async def main() -> list[dict]:
        registry = ToolRegistry.from_config(args.config)
        try:
            await registry.start()
            return [{"tool": n, "service": registry.service_of(n),
                     "description": registry.schemas([n])[0]["function"].get("description", "")}
                    for n in registry.names()]
        finally:
            await registry.aclose()

    for row in asyncio.run(main()):
        if args.json:
            print(json.dumps(row))
        else:
            summary = row["description"].splitlines()[0] if row["description"] else ""
            print(f"{row['tool']:<24} {row['service']:<24} {summary}")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    tools = subparsers.add_parser("tools", help="serve tools over HTTP, list configured tools")
    sub = tools.add_subparsers(dest="tools_command", metavar="ACTION", required=True)

    p = sub.add_parser("serve", help="serve Python functions as a tool service (GET /tools, POST /tools/{name})",
                       description=SERVE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="+", metavar="SPEC", help="package.module:fn1,fn2 or path/to/file.py:fn1")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1); any other needs a token")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: pick a free one); default 8000")
    p.add_argument("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
    p.add_argument("--tool-kwargs", default=None,
                   help='JSON session defaults per tool, e.g. \'{"lookup": {"kb_path": "kb.jsonl"}}\'')
    p.add_argument("--max-concurrency", type=int, default=1024,
                   help="calls in flight before the service answers 503 + Retry-After")
    p.add_argument("--idle-ttl-s", type=float, default=3600.0, help="release sessions idle this long")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=_serve)

    p = sub.add_parser("list", help="discover the tools of a tools config and print them")
    p.add_argument("--config", required=True, help="a tools YAML, e.g. configs/tools/builtin.yaml")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=_list)
