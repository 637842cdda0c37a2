"""Bearer tokens for agentrl's services (tool service, sandbox, engine server) and their clients.

Server side. A service bound to loopback (127.0.0.0/8, ::1, localhost) needs no token, as before. Given a
token (`--token-file PATH`, else the `AGENTRL_SERVICE_TOKEN` environment variable), every request but
`GET /health` must carry `Authorization: Bearer <token>`; one that does not gets 401 with a JSON `detail`
saying what was missing or wrong (the token itself is never echoed). Tokens are compared with
`hmac.compare_digest`. A service asked to listen beyond loopback without a token refuses to start
(`require_token`), before it binds its port or loads anything.

Client side. Each client config names the same token file (`tools.services[i].token_file`,
`reward.sandbox_token_file`, `engine.token_file`); the client sends the header on every request, and a 401
becomes one `ServiceAuthError` naming the service's URL and that key, never a retry.

A token file holds the token on its first line (surrounding whitespace ignored). A missing or empty file is an
error; a file other users may read is used, with a warning to `chmod 600` it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any, Awaitable, Callable

from agentrl.errors import UserError

TOKEN_ENV = "AGENTRL_SERVICE_TOKEN"
OPEN_PATHS = frozenset({"/health"})  # answered without a token (liveness probes, `wait_healthy`)
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: safe in an HTTP header

log = logging.getLogger(__name__)


class ServiceAuthError(UserError):
    """A token is missing, unreadable or refused: the message names the file, option or config key to fix."""


# ------------------------------------------------------------------------------------------------ tokens


def _checked(token: str, where: str) -> str:
    if not token:
        raise ServiceAuthError(f"{where} is empty: put a shared secret in it, e.g. the output of "
                               f"`python -c 'import secrets; print(secrets.token_hex(32))'`")
    if not _TOKEN_CHARS.fullmatch(token):
        raise ServiceAuthError(f"{where} holds spaces or characters outside printable ASCII, which cannot travel "
                               f"in an Authorization header: use e.g. a hex string")
    return token


def read_token_file(path: str | Path, key: str) -> str:
    """The token in the file at `path`; `key` (an option or config key) is named in the error if it fails."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServiceAuthError(f"{key}: token file {p} does not exist; write the service's shared secret there "
                               f"or fix the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ServiceAuthError(f"{key}: cannot read token file {p} ({getattr(e, 'strerror', None) or e})") from None
    lines = text.strip().splitlines()
    token = _checked(lines[0].strip() if lines else "", f"{key}: token file {p}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s can be read by other users (mode %o): chmod 600 %s", p, mode & 0o777, p)
    return token


def server_token(token_file: str | None) -> str | None:
    """A service's token: from `--token-file` when given, else from $AGENTRL_SERVICE_TOKEN, else None."""
    if token_file:
        return read_token_file(token_file, "--token-file")
    value = os.environ.get(TOKEN_ENV)
    if value is None:
        return None
    return _checked(value.strip(), f"${TOKEN_ENV}")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches: 127.0.0.0/8, ::1 and "localhost"."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another host name: it may resolve to any interface
        return False


TOKEN_HELP = (f"file holding a shared secret; every request but GET /health must then send 'Authorization: Bearer "
              f"<secret>' (default: ${TOKEN_ENV} if set; required with a --host other than loopback)")
CLI_FIX = f"pass --token-file PATH (a file holding a shared secret) or set {TOKEN_ENV}, or use --host 127.0.0.1"


def require_token(host: str, token: str | None, command: str, fix: str = CLI_FIX) -> None:
    """Refuse to serve beyond loopback without a token (`command` e.g. "agentrl tools serve", `fix` the remedy
    in that command's terms)."""
    if token is None and not is_loopback(host):
        raise ServiceAuthError(f"{command} on host {host} would accept requests from other machines without a "
                               f"token: {fix}")


def service_token(host: str, token_file: str | None, command: str) -> str | None:
    """What a `serve` command calls first: the token (or None on loopback without one), or a ServiceAuthError."""
    token = server_token(token_file)
    require_token(host, token, command)
    return token


# ------------------------------------------------------------------------------------------------ server side


def refusal(scope: dict, token: bytes) -> str | None:
    """Why the HTTP request `scope` may not pass (None: it may); never quotes the token."""
    if scope["path"] in OPEN_PATHS:
        return None
    sent = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), None)
    if sent is None:
        return "missing Authorization header: send 'Authorization: Bearer <token>' with the service's token"
    scheme, _, credentials = sent.partition(b" ")
    if scheme.lower() != b"bearer" or not credentials.strip():
        return "the Authorization header is not 'Bearer <token>'"
    if not hmac.compare_digest(credentials.strip(), token):
        return "wrong bearer token: send the token of the service's --token-file (or its $" + TOKEN_ENV + ")"
    return None


async def send_unauthorized(send: Callable[[dict], Awaitable[None]], reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """ASGI middleware: HTTP requests without the right bearer token get 401 (except `OPEN_PATHS`); lifespan and
    other scopes pass. `app.add_middleware(BearerAuth, token=...)` on FastAPI, or wrap a raw ASGI app."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.token = token.encode("ascii")

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            reason = refusal(scope, self.token)
            if reason is not None:
                await send_unauthorized(send, reason)
                return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------------------ client side


def bearer_headers(token_file: str | None, key: str) -> dict[str, str]:
    """{"authorization": "Bearer ..."} from the token file at config key `key`; {} when none is configured."""
    if not token_file:
        return {}
    return {"authorization": f"Bearer {read_token_file(token_file, key)}"}


def unauthorized(service: str, key: str, detail: str = "") -> ServiceAuthError:
    """The error for a 401 from `service` (its name and URL, e.g. "sandbox http://h:8080"), whose token file is
    configured at `key`."""
    why = f" ({detail})" if detail else ""
    return ServiceAuthError(f"{service} refused the request with HTTP 401{why}: set {key} to the file holding the "
                            f"token the service was started with (its --token-file or ${TOKEN_ENV})")


__all__ = ["CLI_FIX", "OPEN_PATHS", "TOKEN_ENV", "TOKEN_HELP", "BearerAuth", "ServiceAuthError", "bearer_headers",
           "is_loopback", "read_token_file", "refusal", "require_token", "send_unauthorized", "server_token",
           "service_token", "unauthorized"]
