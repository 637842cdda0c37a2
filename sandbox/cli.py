"""`agentrl sandbox serve`: start the code-execution sandbox service."""

from __future__ import annotations

import argparse
import logging
import sys

from agentrl.auth import TOKEN_HELP
from agentrl.errors import UserError, debug_enabled, one_line


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1); any other needs a token")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (0: pick a free one); default 8080")
    p.add_argument("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
    p.add_argument("--backend", choices=["bwrap", "docker"], default=None, help="isolation backend (default bwrap)")
    p.add_argument("--allow-unsafe", action="store_true",
                   help="if no backend can isolate, run code as plain processes instead of refusing to start")
    p.add_argument("--config", default=None, help="YAML file of SandboxConfig keys (sandbox/config.py)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one SandboxConfig key, e.g. --set max_concurrency=4 (repeatable)")
    p.add_argument("--log-level", default="warning")


def build_config(args: argparse.Namespace):
    from agentrl.config import load_config
    from sandbox.config import SandboxConfig

    data = {}
    if args.backend:
        data["backend"] = args.backend
    if args.allow_unsafe:
        data["allow_unsafe"] = True
    return load_config(SandboxConfig, args.config, overrides=args.overrides, data=data)


class SandboxStartError(UserError):
    """The sandbox cannot start on this host (no isolation backend, a failed canary run)."""


def serve(args: argparse.Namespace) -> int:
    from agentrl.auth import service_token
    from agentrl.services import bind_port, serve_asgi
    from sandbox.app import create_app
    from sandbox.backends.base import BackendError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = service_token(args.host, args.token_file, "agentrl sandbox serve")
    cfg = build_config(args)  # a ConfigError names the key
    app = create_app(cfg, token=token)
    service = app.state.service

    async def start() -> None:
        try:
            await service.start()
        except BackendError as e:
            raise SandboxStartError(f"sandbox cannot start: {e}") from None

    def ready(url: str) -> str:
        return f"sandbox ready on {url} (backend {service.backend.name}, isolation {service.backend.isolation})"

    with bind_port(args.host, args.port) as sock:
        serve_asgi(app, sock, ready, before_start=start, log_level=args.log_level, lifespan="on",
                   timeout_graceful_shutdown=5)
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("sandbox", help="code-execution sandbox service (SandboxFusion-compatible)")
    sub = p.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve /run_code and sessions over HTTP")
    add_serve_arguments(s)
    s.set_defaults(func=serve)


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox`: like `agentrl sandbox serve`, a UserError is one line on stderr and exit code 2."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="python -m sandbox", description="code-execution sandbox service")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except UserError as e:
        if debug_enabled():
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
