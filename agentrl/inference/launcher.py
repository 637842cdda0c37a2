"""Start SGLang servers for RL (GPU machines): one `python -m sglang.launch_server` process per GPU group.

Flags RL needs: `--enable-memory-saver` (without it `SGLangEngine.release/resume_memory_occupation` fail; no
trainer code calls them yet, so the servers keep their memory and the trainer needs GPUs of its own), an explicit
`--mem-fraction-static`, `--tp-size`, and loopback hosts. Each server gets its own GPUs through
CUDA_VISIBLE_DEVICES. `launch_sglang_servers` waits for every server's /health and kills the whole set if any of
them dies or times out. None of this has run against a real SGLang server (docs/engines.md, "Not yet verified").

API key. Given a token (`--token-file`, else $AGENTRL_SERVICE_TOKEN, as `agentrl.auth` reads it), every server
gets it as SGLang's `--api-key` without the secret on its command line, where `ps` shows it to every user: it
goes into a YAML file of SGLang's `--config` option (mode 600, in a private temporary directory that is removed
once the servers answer /health; SGLang reads the file while it parses its arguments). SGLang 0.5.23 then asks
for `Authorization: Bearer <key>` on every route but /health*, /ready* and /metrics*. It still prints its
server_args, the api key among them, in its start-up log and answers them on /server_info (behind the key):
keep its log private. A --host other than loopback needs a token.

LoRA (`engine.lora_sync: adapter`, `lora_launch_args`): SGLang serves adapters loaded at run time through
/load_lora_adapter only when launched with `--enable-lora` and, with no adapter given at launch, both
`--max-lora-rank` and `--lora-target-modules` (they size its adapter memory pool; a larger rank or another module
is refused at load). `--max-loras-per-batch 2 --max-loaded-loras 2`: the trainer loads each step's adapter under a
new name, switches the requests to it and unloads the one before (`agentrl.trainer.lora_sync`); past two loaded,
SGLang unloads the least recently used, which clears adapters an earlier run left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import httpx

from agentrl.auth import TOKEN_ENV
from agentrl.errors import UserError

API_KEY_CONFIG = "API_KEY_CONFIG"  # what --dry-run prints for the --config file written at launch
_SECRET_FLAGS = ("--api-key", "--admin-api-key", "--config")  # flags after -- that clash with a token given here
_LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "--lora-target-modules", "--max-loras-per-batch",
               "--max-loaded-loras")  # flags after -- that clash with --lora-rank


class LaunchArgsError(UserError):
    """Flags after `--` that the launcher's own options already set, or LoRA options out of range."""


def lora_launch_args(rank: int, target_modules: list[str] | str, max_loras_per_batch: int = 2) -> list[str]:
    """SGLang's launch flags for serving a LoRA policy's adapters (`engine.lora_sync: adapter`): `rank` and
    `target_modules` as in actor.lora (peft's "all-linear" is SGLang's "all")."""
    if isinstance(target_modules, str):
        if target_modules != "all-linear":
            raise LaunchArgsError(f"LoRA target_modules {target_modules!r}: SGLang takes module names (q_proj "
                                  f"v_proj ...) or all-linear, not a pattern; list the modules")
        target_modules = [target_modules]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1 or max_loras_per_batch < 1:
        raise LaunchArgsError(f"LoRA rank ({rank!r}) and max_loras_per_batch ({max_loras_per_batch}) must be >= 1")
    if not target_modules:
        raise LaunchArgsError("LoRA target_modules (--lora-target-modules) is empty: list the adapted modules "
                              "(e.g. q_proj v_proj)")
    modules = ["all" if m == "all-linear" else m for m in target_modules]
    return ["--enable-lora", "--max-lora-rank", str(rank), "--lora-target-modules", *modules,
            "--max-loras-per-batch", str(max_loras_per_batch), "--max-loaded-loras", str(max_loras_per_batch)]


@dataclass
class SGLangLaunchSpec:
    model_path: str
    num_servers: int = 1
    tp: int = 1
    base_port: int = 30000
    host: str = "127.0.0.1"
    gpus: list[int] | None = None  # GPU ids to spread over the servers; None: 0 .. num_servers * tp - 1
    mem_fraction_static: float | None = 0.7
    context_length: int | None = None
    dtype: str | None = None
    enable_memory_saver: bool = True
    deterministic: bool = False
    extra_args: list[str] = field(default_factory=list)
    api_key_config: str | None = None  # SGLang --config YAML holding `api-key` (`write_api_key_config`)
    lora_rank: int | None = None  # serve LoRA adapters of up to this rank (`lora_launch_args`); None: no LoRA
    lora_target_modules: list[str] = field(default_factory=list)
    max_loras_per_batch: int = 2

    def __post_init__(self) -> None:
        if self.num_servers < 1 or self.tp < 1:
            raise ValueError(f"num_servers ({self.num_servers}) and tp ({self.tp}) must be >= 1")
        need = self.num_servers * self.tp
        if self.gpus is not None and len(self.gpus) < need:
            raise ValueError(f"{self.num_servers} servers x tp {self.tp} need {need} GPUs, --gpus lists "
                             f"{len(self.gpus)}: {self.gpus}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.lora_rank is not None:
            lora_launch_args(self.lora_rank, self.lora_target_modules, self.max_loras_per_batch)  # raises if wrong
            clash = [a for a in self.extra_args if a.split("=", 1)[0] in _LORA_FLAGS]
            if clash:
                raise LaunchArgsError(f"{' '.join(clash)} after -- clashes with --lora-rank, which sets SGLang's LoRA "
                                      f"flags itself: drop {' '.join(clash)}")

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{self.base_port + i}" for i in range(self.num_servers)]


def sglang_server_commands(spec: SGLangLaunchSpec) -> list[tuple[dict[str, str], list[str]]]:
    """(extra environment, argv) per server."""
    gpus = spec.gpus if spec.gpus is not None else list(range(spec.num_servers * spec.tp))
    out = []
    for i in range(spec.num_servers):
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model_path,
               "--host", spec.host, "--port", str(spec.base_port + i), "--tp-size", str(spec.tp)]
        if spec.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(spec.mem_fraction_static)]
        if spec.context_length is not None:
            cmd += ["--context-length", str(spec.context_length)]
        if spec.dtype is not None:
            cmd += ["--dtype", spec.dtype]
        if spec.enable_memory_saver:
            cmd.append("--enable-memory-saver")
        if spec.deterministic:
            cmd.append("--enable-deterministic-inference")
        if spec.api_key_config is not None:
            cmd += ["--config", spec.api_key_config]
        if spec.lora_rank is not None:
            cmd += lora_launch_args(spec.lora_rank, spec.lora_target_modules, spec.max_loras_per_batch)
        cmd += list(spec.extra_args)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus[i * spec.tp:(i + 1) * spec.tp])}
        out.append((env, cmd))
    return out


def check_extra_args(extra_args: list[str], token: str | None) -> None:
    """With a token, flags after `--` may not set the key another way (`--api-key` would also show it in `ps`)."""
    if token is None:
        return
    clash = [a for a in extra_args if a.split("=", 1)[0] in _SECRET_FLAGS]
    if clash:
        flags = " ".join(clash)
        raise LaunchArgsError(f"{flags} after -- clashes with the token (--token-file or ${TOKEN_ENV}), which "
                              f"launch-sglang passes to SGLang as --api-key through a private --config file: drop "
                              f"{flags}, and put other options after -- instead of in a --config file")


def write_api_key_config(token: str, directory: str | Path) -> Path:
    """`directory/api_key.yaml` (mode 600) holding `api-key: <token>`, for SGLang's `--config`."""
    import yaml

    path = Path(directory) / "api_key.yaml"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({"api-key": token}, f)
    return path


class SGLangServers:
    """Running server processes; `close()` (or leaving the `with`) terminates their process groups."""

    def __init__(self, spec: SGLangLaunchSpec, procs: list[subprocess.Popen]):
        self.spec = spec
        self.procs = procs
        self.urls = spec.urls

    def wait(self) -> None:
        """Block until a server exits (then raise) or Ctrl-C."""
        while True:
            for url, proc in zip(self.urls, self.procs):
                if proc.poll() is not None:
                    raise RuntimeError(f"SGLang server {url} exited with code {proc.returncode}")
            time.sleep(1.0)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def wait_healthy(urls: list[str], procs: list[subprocess.Popen] | None, timeout_s: float) -> None:
    """Poll every url's /health until all answer 200; raise if a process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    pending = list(range(len(urls)))
    while pending:
        for i in list(pending):
            if procs is not None and procs[i].poll() is not None:
                raise RuntimeError(f"SGLang server {urls[i]} exited with code {procs[i].returncode} before it "
                                   f"became healthy; run its command by hand to see why")
            try:
                if httpx.get(f"{urls[i]}/health", timeout=5.0).status_code == 200:
                    pending.remove(i)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"SGLang servers {[urls[i] for i in pending]} not healthy after {timeout_s}s")
        if pending:
            time.sleep(2.0)


@contextlib.contextmanager
def launch_sglang_servers(spec: SGLangLaunchSpec, health_timeout_s: float = 900.0,
                          token: str | None = None) -> Iterator[SGLangServers]:
    """Start the servers of `spec` (with `token` as their --api-key) and wait until all are healthy."""
    check_extra_args(spec.extra_args, token)
    secret_dir = tempfile.mkdtemp(prefix="agentrl-sglang-") if token is not None else None  # mode 700
    if secret_dir is not None:
        spec = replace(spec, api_key_config=str(write_api_key_config(token, secret_dir)))
    procs = []
    servers = SGLangServers(spec, procs)
    try:
        for env, cmd in sglang_server_commands(spec):
            procs.append(subprocess.Popen(cmd, env={**os.environ, **env}, start_new_session=True))
        wait_healthy(servers.urls, procs, health_timeout_s)
        if secret_dir is not None:  # every server has read its arguments long before /health answers
            shutil.rmtree(secret_dir, ignore_errors=True)
        yield servers
    finally:
        servers.close()
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)


__all__ = ["API_KEY_CONFIG", "LaunchArgsError", "SGLangLaunchSpec", "SGLangServers", "check_extra_args",
           "launch_sglang_servers", "lora_launch_args", "sglang_server_commands", "wait_healthy",
           "write_api_key_config"]
