"""What the preflight tests share: a model directory that passes the file checks, ports that refuse connections."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Iterator


def fake_model_dir(path: Path) -> Path:
    """The files `check_model_dir` looks for (config, tokenizer, weights); nothing here can be loaded."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (path / "tokenizer.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


@contextlib.contextmanager
def refused_ports(count: int = 1) -> Iterator[list[int]]:
    """Loopback ports bound but not listening: a connection is refused at once, and no other process can take
    the port while the block runs (a closed free port could be reused by anyone)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        yield ports


def services_yaml(path: Path, ports: list[int]) -> Path:
    """A tools YAML listing one HTTP tool service per port."""
    lines = ["services:"] + [f"  - name: svc{i}\n    url: http://127.0.0.1:{port}\n    retries: 0"
                             for i, port in enumerate(ports)]
    path.write_text("\n".join(lines) + "\n")
    return path
