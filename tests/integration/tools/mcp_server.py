"""An MCP server built with the official SDK (`mcp.server.mcpserver.MCPServer`), over streamable HTTP.

`python mcp_server.py PORT`; the MCP endpoint is /mcp, and /health answers plain HTTP for the test harness.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse

server = MCPServer("agentrl-test", log_level="CRITICAL")  # no rich tracebacks for the expected failure


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str, times: int = 1) -> str:
    """Upper-case `text`, repeated `times` times."""
    return " ".join([text.upper()] * times)


@server.tool()
def explode(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


SEEN_AUTH: set[str] = set()


@server.custom_route("/health", methods=["GET"])
async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok", "seen_authorization": sorted(SEEN_AUTH)})


def record_auth(app):
    """ASGI middleware remembering Authorization headers, so the test can check a client sent them."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "http":
            for key, value in scope["headers"]:
                if key == b"authorization":
                    SEEN_AUTH.add(value.decode())
        await app(scope, receive, send)
    return wrapped


if __name__ == "__main__":
    uvicorn.run(record_auth(server.streamable_http_app()), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning")
