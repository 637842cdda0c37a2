"""A deliberately misbehaving tool service for the retry / error-mapping tests: `python flaky_app.py PORT`.

Every route sits under a mode prefix, so one process offers several services (base url http://host:port/MODE):
- retry: the first call of each `key` answers 503 with Retry-After: 1, later calls succeed;
- busy: always 503 with Retry-After: 0;
- crash: always 500;
- bad: GET /tools returns an invalid schema.
`GET /log` returns the arrival times of calls per mode and key.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
ARRIVALS: dict[str, list[float]] = defaultdict(list)
PING = {"type": "function", "function": {"name": "ping", "description": "Answer pong.",
                                         "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                        "required": ["key"]}}}


@app.get("/log")
async def log() -> dict:
    return ARRIVALS


@app.get("/{mode}/health")
async def health(mode: str) -> dict:
    return {"status": "ok", "tools": ["ping"], "stateful_tools": []}


@app.get("/{mode}/tools")
async def tools(mode: str) -> list:
    if mode == "bad":
        return [{"type": "function", "function": {"name": "ping", "parameters": {"type": "string"}}}]
    return [PING]


@app.post("/{mode}/tools/ping")
async def ping(mode: str, request: Request) -> JSONResponse:
    key = (await request.json())["arguments"]["key"]
    ARRIVALS[f"{mode}/{key}"].append(time.monotonic())
    if mode == "retry" and len(ARRIVALS[f"{mode}/{key}"]) == 1:
        return JSONResponse({"detail": "warming up"}, status_code=503, headers={"Retry-After": "1"})
    if mode == "busy":
        return JSONResponse({"detail": "busy"}, status_code=503, headers={"Retry-After": "0"})
    if mode == "crash":
        return JSONResponse({"detail": "database is on fire"}, status_code=500)
    return JSONResponse({"content": "pong", "is_error": False})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
