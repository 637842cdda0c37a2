"""Sandbox service configuration (one dataclass, validated on construction)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal


DEFAULT_HOST_UID_BASE = 2_000_000_000  # far above login users and the usual /etc/subuid ranges, below 2**31


def default_concurrency() -> int:
    return max(2, os.cpu_count() or 2)


@dataclass
class SandboxConfig:
    backend: Literal["bwrap", "docker"] = "bwrap"
    allow_unsafe: bool = False           # run without isolation when no backend can isolate (never by default)
    # admission
    max_concurrency: int = 0             # running requests at once; 0 = number of cores (at least 2)
    max_queue: int = 64                  # requests waiting for a slot; beyond it -> 503
    queue_timeout_s: float = 30.0        # longest wait for a slot before 503 + Retry-After
    max_body_bytes: int = 16 * 1024 * 1024
    # per-request limits (a request may ask for less, never more)
    default_run_timeout_s: float = 10.0
    max_run_timeout_s: float = 120.0
    default_memory_mb: int = 512
    max_memory_mb: int = 4096
    max_output_bytes: int = 256 * 1024   # per stream kept (head + tail); beyond it `truncated`
    output_kill_bytes: int = 32 * 1024 * 1024  # per stream produced; beyond it the run is killed (output_limit)
    max_file_bytes: int = 64 * 1024 * 1024     # RLIMIT_FSIZE: largest file the code may write
    tmpfs_mb: int = 256                  # size of the work dir and of /tmp (each)
    pids_limit: int = 128                # processes + threads per sandbox (pids cgroup)
    nofile_limit: int = 1024
    cpu_quota: float = 1.0               # CPUs per sandbox (cpu cgroup)
    warm_pool: int = 0                   # pre-started sandboxes; 0 = 2 * max_concurrency + 4
    zygote: bool = True                  # sandboxes forked from one root interpreter (false: bwrap each)
    # host uids for the sandboxes of a service run as root, one per live sandbox, never 0: 0 = root's range in
    # /etc/subuid (and the same range in /etc/subgid), else DEFAULT_HOST_UID_BASE; see docs/sandbox.md
    host_uid_base: int = 0
    host_uid_count: int = 65536
    # sessions
    max_sessions: int = 32
    default_idle_ttl_s: float = 600.0
    max_idle_ttl_s: float = 3600.0
    session_interrupt_grace_s: float = 1.0
    # docker backend
    docker_image: str = "python:3.11-slim"

    def __post_init__(self) -> None:
        if self.max_concurrency == 0:
            self.max_concurrency = default_concurrency()
        if self.warm_pool == 0:
            self.warm_pool = 2 * self.max_concurrency + 4
        for name in ("max_concurrency", "max_body_bytes", "max_output_bytes", "output_kill_bytes", "max_file_bytes",
                     "tmpfs_mb", "pids_limit", "nofile_limit", "max_sessions", "default_memory_mb", "max_memory_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"SandboxConfig.max_queue must be >= 0, got {self.max_queue}")
        if self.output_kill_bytes < self.max_output_bytes:
            raise ValueError("SandboxConfig.output_kill_bytes must be >= max_output_bytes "
                             f"({self.output_kill_bytes} < {self.max_output_bytes})")
        if not 0 < self.default_run_timeout_s <= self.max_run_timeout_s:
            raise ValueError("SandboxConfig needs 0 < default_run_timeout_s <= max_run_timeout_s, got "
                             f"{self.default_run_timeout_s} and {self.max_run_timeout_s}")
        if self.default_memory_mb > self.max_memory_mb:
            raise ValueError(f"SandboxConfig.default_memory_mb ({self.default_memory_mb}) exceeds max_memory_mb "
                             f"({self.max_memory_mb})")
        if self.host_uid_base < 0 or self.host_uid_count <= 0 or self.host_uid_base + self.host_uid_count > 2**32 - 2:
            raise ValueError(f"SandboxConfig.host_uid_base/host_uid_count: {self.host_uid_base} + "
                             f"{self.host_uid_count} must be a range of uids in 1..4294967294")
        if self.cpu_quota <= 0:
            raise ValueError(f"SandboxConfig.cpu_quota must be > 0 CPUs, got {self.cpu_quota}")


def _subordinate_range(path: str, user: str = "root") -> tuple[int, int] | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.strip().partition(":")
                start, _, count = rest.partition(":")
                if name in (user, "0") and start.isdigit() and count.isdigit():
                    return int(start), int(count)
    except OSError:
        pass
    return None


def host_uids(cfg: SandboxConfig) -> range:
    """The host uids the sandboxes of a root service run as (each uid is also the sandbox's gid): the configured
    range, or root's subordinate range when /etc/subuid and /etc/subgid give it the same one, or the default."""
    if cfg.host_uid_base:
        return range(cfg.host_uid_base, cfg.host_uid_base + cfg.host_uid_count)
    sub_u, sub_g = _subordinate_range("/etc/subuid"), _subordinate_range("/etc/subgid")
    if sub_u is not None and sub_u == sub_g and sub_u[0] > 0:
        return range(sub_u[0], sub_u[0] + sub_u[1])
    return range(DEFAULT_HOST_UID_BASE, DEFAULT_HOST_UID_BASE + cfg.host_uid_count)
