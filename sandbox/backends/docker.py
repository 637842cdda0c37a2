"""Docker backend: a warm pool of locked-down, single-use containers, driven through the `docker` SDK.

Each container: `network_mode=none`, memory limit with swap off, pids limit, CPU quota, read-only root with
size-limited tmpfs for /tmp and /workspace, `cap_drop=ALL`, `no-new-privileges`, uid 65534. A request runs the
same runner as the bwrap backend through `docker exec` (request frame + stdin on the exec's stdin, stdout and
stderr demultiplexed, the result frame written to a file inside the container), then the container is removed
and a fresh one started in the background. The SDK is synchronous, so its calls run in worker threads.

Limits of this backend: sessions are not offered (they need a private result channel that `docker exec` does
not give; use the bwrap backend), and an OOM kill is inferred from SIGKILL + a memory peak at the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import time

from sandbox.backends.base import BackendError, ExecRequest, ExecResult, encode_request, python_argv, runner_payload
from sandbox.backends.bwrap import RUNNER_SRC, WORKDIR, sandbox_env
from sandbox.config import SandboxConfig
from sandbox.output import HeadTail

RESULT_PATH = "/tmp/.agentrl-result"


class DockerBackend:
    name = "docker"
    isolation = "docker"

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.client = None
        self._ready: asyncio.Queue = asyncio.Queue()
        self._spawning = 0
        self._closing = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.spawn_failures = 0
        self.last_spawn_error = ""

    async def start(self) -> None:
        try:
            import docker  # imported here: the SDK is optional (`pip install agentrl[docker]`)
        except ImportError as e:
            raise BackendError("the docker backend needs the `docker` package: pip install 'agentrl[docker]'") from e
        try:
            self.client = await asyncio.to_thread(docker.from_env)
            await asyncio.to_thread(self.client.ping)
        except docker.errors.DockerException as e:
            raise BackendError(f"no Docker engine answers ({e}); start dockerd or use --backend bwrap") from e
        try:
            await asyncio.to_thread(self.client.images.get, self.cfg.docker_image)
        except docker.errors.ImageNotFound as e:
            raise BackendError(f"docker image {self.cfg.docker_image!r} is not present: `docker pull "
                               f"{self.cfg.docker_image}` or set docker_image") from e
        self._task = asyncio.create_task(self._refill_loop())
        self._wake.set()

    def info(self) -> dict:
        return {"backend": "docker", "isolation": "docker", "cgroup_version": None, "image": self.cfg.docker_image,
                "warm_pool": self.cfg.warm_pool, "warm_sandboxes": self._ready.qsize(),
                "spawn_failures": self.spawn_failures, "last_spawn_error": self.last_spawn_error}

    def _create(self):
        from docker.types import Ulimit

        tmpfs_opts = f"size={self.cfg.tmpfs_mb}m,uid=65534,gid=65534,mode=1777"
        mem = f"{self.cfg.default_memory_mb}m"
        return self.client.containers.run(
            self.cfg.docker_image, command=["sleep", "infinity"], detach=True, network_mode="none",
            mem_limit=mem, memswap_limit=mem, pids_limit=self.cfg.pids_limit,
            nano_cpus=int(self.cfg.cpu_quota * 1e9), read_only=True,
            tmpfs={"/tmp": tmpfs_opts, "/workspace": tmpfs_opts}, working_dir="/workspace", user="65534:65534",
            cap_drop=["ALL"], security_opt=["no-new-privileges"], init=True,
            environment=sandbox_env("/usr/local"),
            ulimits=[Ulimit(name="fsize", soft=self.cfg.max_file_bytes, hard=self.cfg.max_file_bytes),
                     Ulimit(name="nofile", soft=self.cfg.nofile_limit, hard=self.cfg.nofile_limit),
                     Ulimit(name="core", soft=0, hard=0)],
            labels={"agentrl.sandbox": str(os.getpid())})

    async def _refill_loop(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while not self._closing and self._ready.qsize() + self._spawning < self.cfg.warm_pool:
                self._spawning += 1
                asyncio.create_task(self._spawn_one())

    async def _spawn_one(self) -> None:
        import docker

        try:
            container = await asyncio.to_thread(self._create)
        except docker.errors.DockerException as e:
            self.spawn_failures += 1
            self.last_spawn_error = str(e)[:500]
            await asyncio.sleep(1)
            self._spawning -= 1
            self._wake.set()
            return
        self._spawning -= 1
        self._ready.put_nowait(container)

    async def _take(self):
        self._wake.set()
        if not self._ready.empty():
            return self._ready.get_nowait()
        return await asyncio.to_thread(self._create)

    def _remove(self, container) -> None:
        import docker

        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)

    def _run(self, container, req: ExecRequest) -> ExecResult:
        """Blocking: one program in `container` through `docker exec`, with the time limit on the socket."""
        import docker

        payload = runner_payload(req, self.cfg)
        mem = f"{req.memory_mb}m"
        container.update(mem_limit=mem, memswap_limit=mem)
        api = self.client.api
        # The same interpreter flags as the bwrap backend (-I -S; the runner defines what `site` would).
        exec_id = api.exec_create(container.id, python_argv("python3", RUNNER_SRC, f"file:{RESULT_PATH}"),
                                  stdin=True, stdout=True, stderr=True, workdir=WORKDIR, user="65534:65534")
        sock = api.exec_start(exec_id, socket=True)
        raw: socket.socket = getattr(sock, "_sock", sock)
        data = encode_request(payload) + req.stdin
        out, err = HeadTail(self.cfg.max_output_bytes), HeadTail(self.cfg.max_output_bytes)
        reason = None
        deadline = time.monotonic() + req.run_timeout + 0.5 + (req.compile_timeout + 2 if "compile" in payload else 0)
        try:
            raw.settimeout(5)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, socket.timeout):
                raw.sendall(data)
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)
            buf = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    reason = "timeout"
                    break
                raw.settimeout(left)
                try:
                    chunk = raw.recv(1 << 16)
                except socket.timeout:
                    reason = "timeout"
                    break
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 8:  # docker's multiplexed stream: [stream, 0, 0, 0, size (4 bytes)] + payload
                    stream, size = buf[0], struct.unpack(">I", buf[4:8])[0]
                    if len(buf) < 8 + size:
                        break
                    (out if stream == 1 else err).feed(buf[8:8 + size])
                    buf = buf[8 + size:]
                if out.total > self.cfg.output_kill_bytes or err.total > self.cfg.output_kill_bytes:
                    reason = "output_limit"
                    break
        finally:
            raw.close()
        result = compiled = None
        marker = ""
        with contextlib.suppress(docker.errors.DockerException, ValueError, IndexError):
            text = container.exec_run(["cat", RESULT_PATH], user="65534:65534").output
            frames = _frames(text)
            nonce = next((f.get("nonce") for f in frames if f.get("ready")), None)
            marker = f"\x00agentrl-run-end:{nonce}\x00" if isinstance(nonce, str) and nonce else ""
            compiled = next((f["compile"] for f in frames if "compile" in f), None)
            if reason is None:
                result = frames[-1] if frames and "exit" in frames[-1] else None
        elapsed = req.run_timeout if reason == "timeout" else (result or {}).get("elapsed", 0.0)
        sig, code = None, None
        if result is not None:
            exit_info = result["exit"]
            sig = exit_info.get("signal")
            code = 128 + sig if sig else exit_info["code"]
        exit_reason = reason or ("signal" if sig else "exit")
        if sig == 9 and reason is None:
            exit_reason = "oom"  # nothing else SIGKILLs inside the container but the OOM killer or the code
        if compiled is None and "compile" in payload:
            compiled = {"status": "TimeLimitExceeded", "execution_time": None, "return_code": None, "stdout": "",
                        "stderr": ""}
        if compiled is not None:
            compiled = {k: compiled.get(k) for k in ("status", "execution_time", "return_code", "stdout", "stderr")}
        ran = compiled is None or (compiled["status"] == "Finished" and compiled["return_code"] == 0)
        return ExecResult(compile=compiled, ran=ran,
                          status="TimeLimitExceeded" if reason == "timeout" else "Finished",
                          return_code=None if reason == "timeout" else (code if code is not None else 137),
                          exit_reason=exit_reason, stdout=_unmark(out.text(), marker),
                          stderr=_unmark(err.text(), marker),
                          truncated=out.truncated or err.truncated,
                          signal=signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else None,
                          execution_time=round(elapsed, 4), files=(result or {}).get("files", {}),
                          file_errors=(result or {}).get("file_errors", {}))

    async def execute(self, req: ExecRequest) -> ExecResult:
        import docker

        try:
            container = await self._take()
        except docker.errors.DockerException as e:
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=f"docker: {e}")
        try:
            return await asyncio.to_thread(self._run, container, req)
        except docker.errors.DockerException as e:
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=f"docker: {e}")
        finally:
            await asyncio.to_thread(self._remove, container)

    async def open_session(self, language: str, memory_mb: int, forkable: bool = False):
        raise BackendError("sessions are offered by the bwrap backend only (docker exec has no private result "
                           "channel); start the service with --backend bwrap for sessions")

    async def fork_session(self, source, n: int, memory_mb: int):
        raise ValueError("forks are offered by the bwrap backend's zygote only")

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
        while self._spawning:
            await asyncio.sleep(0.05)
        while not self._ready.empty():
            await asyncio.to_thread(self._remove, self._ready.get_nowait())


def _frames(data: bytes) -> list[dict]:
    frames = []
    while len(data) >= 4:
        size = int.from_bytes(data[:4], "big")
        frames.append(json.loads(data[4:4 + size]))
        data = data[4 + size:]
    return frames


def _unmark(text: str, marker: str) -> str:
    """The output without the runner's end-of-output marker (its nonce arrives in the runner's `ready` frame)."""
    return text.replace(marker, "") if marker else text
