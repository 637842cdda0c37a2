"""Sandbox service configuration (one model, validated on construction; `agentrl sandbox serve --set KEY=VALUE`)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from agentrl.config import ConfigModel

DEFAULT_HOST_UID_BASE = 2_000_000_000  # far above login users and the usual /etc/subuid ranges, below 2**31


def default_concurrency() -> int:
    return max(2, os.cpu_count() or 2)


class SandboxConfig(ConfigModel):
    backend: Literal["bwrap", "docker"] = "bwrap"
    allow_unsafe: bool = False           # run without isolation when no backend can isolate (never by default)
    # admission
    max_concurrency: int = Field(0, ge=0)  # running requests at once; 0 = number of cores (at least 2)
    max_queue: int = Field(64, ge=0)     # requests waiting for a slot; beyond it -> 503
    queue_timeout_s: float = 30.0        # longest wait for a slot before 503 + Retry-After
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # per-request limits (a request may ask for less, never more)
    default_run_timeout_s: float = Field(10.0, gt=0)
    max_run_timeout_s: float = 120.0
    default_memory_mb: int = Field(512, gt=0)
    max_memory_mb: int = Field(4096, gt=0)
    max_output_bytes: int = Field(256 * 1024, gt=0)   # per stream kept (head + tail); beyond it `truncated`
    output_kill_bytes: int = Field(32 * 1024 * 1024, gt=0)  # per stream produced; beyond it the run is killed
    max_file_bytes: int = Field(64 * 1024 * 1024, gt=0)     # RLIMIT_FSIZE: largest file the code may write
    tmpfs_mb: int = Field(256, gt=0)     # size of the work dir and of /tmp (each)
    pids_limit: int = Field(128, gt=0)   # processes + threads per sandbox (pids cgroup)
    nofile_limit: int = Field(1024, gt=0)
    cpu_quota: float = Field(1.0, gt=0)  # CPUs per sandbox (cpu cgroup)
    warm_pool: int = 0                   # pre-started sandboxes; 0 = 2 * max_concurrency + 4
    zygote: bool = True                  # sandboxes forked from one root interpreter (false: bwrap each)
    # host uids for the sandboxes of a service run as root, one per live sandbox, never 0: 0 = root's range in
    # /etc/subuid (and the same range in /etc/subgid), else DEFAULT_HOST_UID_BASE; see docs/sandbox.md
    host_uid_base: int = Field(0, ge=0)
    host_uid_count: int = Field(65536, gt=0)
    # sessions
    max_sessions: int = Field(32, gt=0)
    default_idle_ttl_s: float = 600.0
    max_idle_ttl_s: float = 3600.0
    session_interrupt_grace_s: float = 1.0
    # workspace snapshots (GET /sessions/{id}/snapshot, restore): the bytes of a snapshot's files in all, how
    # many files and directories it holds, and the code of the cells it carries (kept per live session)
    snapshot_max_bytes: int = Field(6 * 1024 * 1024, gt=0)
    snapshot_max_files: int = Field(1024, gt=0)
    snapshot_log_bytes: int = Field(512 * 1024, gt=0)
    # docker backend
    docker_image: str = "python:3.11-slim"

    @model_validator(mode="after")
    def _resolve_and_check(self) -> SandboxConfig:
        if self.max_concurrency == 0:
            self.max_concurrency = default_concurrency()
        if self.warm_pool == 0:
            self.warm_pool = 2 * self.max_concurrency + 4
        if self.output_kill_bytes < self.max_output_bytes:
            raise ValueError("SandboxConfig.output_kill_bytes must be >= max_output_bytes "
                             f"({self.output_kill_bytes} < {self.max_output_bytes})")
        if self.default_run_timeout_s > self.max_run_timeout_s:
            raise ValueError("SandboxConfig needs 0 < default_run_timeout_s <= max_run_timeout_s, got "
                             f"{self.default_run_timeout_s} and {self.max_run_timeout_s}")
        if self.default_memory_mb > self.max_memory_mb:
            raise ValueError(f"SandboxConfig.default_memory_mb ({self.default_memory_mb}) exceeds max_memory_mb "
                             f"({self.max_memory_mb})")
        if 4 * (self.snapshot_tar_bytes // 3 + 1) + 6 * self.snapshot_log_bytes > self.max_body_bytes:
            raise ValueError(f"SandboxConfig.max_body_bytes ({self.max_body_bytes}) cannot hold a restore of the "
                             f"largest snapshot (snapshot_max_bytes {self.snapshot_max_bytes}, snapshot_max_files "
                             f"{self.snapshot_max_files}, snapshot_log_bytes {self.snapshot_log_bytes}): raise it "
                             "or lower those")
        if self.host_uid_base + self.host_uid_count > 2**32 - 2:
            raise ValueError(f"SandboxConfig.host_uid_base/host_uid_count: {self.host_uid_base} + "
                             f"{self.host_uid_count} must be a range of uids in 1..4294967294")
        return self


    @property
    def snapshot_tar_bytes(self) -> int:
        """The largest snapshot tar: the files' bytes plus at most 2 KiB of headers and padding per member."""
        return self.snapshot_max_bytes + 2048 * self.snapshot_max_files + 10240


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
