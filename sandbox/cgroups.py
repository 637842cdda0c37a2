"""cgroups for sandboxes: v1/v2 detection, limits, kill-through-the-cgroup, and a pre-created pool.

A sandbox joins its cgroup *before* bwrap forks (a shell writes `0` into cgroup.procs, then execs bwrap), so
every descendant, daemonised or not, is accounted and killed with it. Creating a cgroup costs tens of
milliseconds here, so the service creates them at start and recycles them; counters that cannot be reset in v1
(OOM kills, pids-limit hits) are read as deltas against a baseline taken before each use.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
V1_FREEZER = "freezer"  # optional: sessions are frozen between cells where it is mounted (v2 has cgroup.freeze)


class CgroupError(RuntimeError):
    """cgroups are missing, not writable, or a cgroup could not be emptied."""


@dataclass
class CgroupCounters:
    oom_kills: int = 0
    pids_max_hits: int = 0
    memory_peak: int = 0

    def delta(self, base: "CgroupCounters") -> "CgroupCounters":
        return CgroupCounters(self.oom_kills - base.oom_kills, self.pids_max_hits - base.pids_max_hits,
                              self.memory_peak)


def detect_version() -> int | None:
    """2 for a unified hierarchy with memory+pids, 1 for v1 memory+pids+cpu controllers, None otherwise."""
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        return 2 if {"memory", "pids"} <= set(controllers) else None
    if all((CGROUP_ROOT / c / "cgroup.procs").is_file() for c in V1_CONTROLLERS):
        return 1
    return None


def _own_path(controller: str | None) -> str:
    """This process's cgroup path for `controller` (v1) or in the unified hierarchy (None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller is None and names == "":
            return path
        if controller is not None and controller in names.split(","):
            return path
    return "/"


def _write(path: Path | str, value: str) -> None:
    # Plain fd calls: cgroup files are read and written several times per request (no buffered file objects).
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path | str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _read_kv(path: Path | str) -> dict[str, int]:
    out = {}
    try:
        for line in _read(path).splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _limit_tcp_v1(mem: Path, memory_bytes: int) -> None:
    """cgroup v1 charges socket buffers to a cgroup only once memory.kmem.tcp.limit_in_bytes is set: without it a
    sandbox can queue far more than its memory limit in loopback TCP buffers, in the host's global TCP memory.
    (cgroup v2 always charges socket memory to memory.current, under memory.max.)"""
    tcp = mem / "memory.kmem.tcp.limit_in_bytes"
    if tcp.exists():
        _write(tcp, str(memory_bytes))


def _rmdir_retry(path: Path, deadline_s: float = 2.0) -> None:
    """rmdir right after the last process exits often fails with EBUSY for a few milliseconds: retry."""
    end = time.monotonic() + deadline_s
    delay = 0.002
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > end:
                raise CgroupError(f"cannot remove cgroup {path}: {e}") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class Cgroup:
    """One sandbox's cgroup: one directory per v1 controller, or one unified v2 directory."""

    def __init__(self, version: int, dirs: dict[str, Path], host_uid: int | None = None):
        self.version = version
        self.dirs = dirs  # v1: controller -> dir; v2: {"unified": dir}
        # The unprivileged host uid (and gid) of the sandbox that holds this cgroup: one per cgroup, so per-user
        # kernel limits (inotify instances, ...) are per sandbox, and reused only once the cgroup is empty.
        self.host_uid = host_uid
        self._limits: tuple | None = None  # what set_limits last wrote: rewriting the same values is skipped
        self._memory: int | None = None
        self.baseline: CgroupCounters | None = None  # counters when it was last emptied (the next use's base)
        # Paths read on every request, as strings once (no pathlib on the request path)
        self.procs_files = [str(d / "cgroup.procs") for key, d in self.dirs.items() if key != V1_FREEZER]
        # Joined by sessions only (a v1 freezer is one more cgroup to enter; a /run_code sandbox never freezes)
        self.freezer_procs = str(self.dirs[V1_FREEZER] / "cgroup.procs") if V1_FREEZER in self.dirs else None
        if version == 1:
            self._freeze_file = str(self.dirs[V1_FREEZER] / "freezer.state") if V1_FREEZER in self.dirs else None
        else:
            freeze = self.dirs["unified"] / "cgroup.freeze"
            self._freeze_file = str(freeze) if freeze.exists() else None
        self.frozen = False
        mem, pids = self._d("memory"), self._d("pids")
        self._counter_files = (str(mem / ("memory.oom_control" if version == 1 else "memory.events")),
                               str(mem / ("memory.max_usage_in_bytes" if version == 1 else "memory.peak")),
                               str(pids / "pids.events"))

    def _d(self, controller: str) -> Path:
        return self.dirs[controller] if self.version == 1 else self.dirs["unified"]

    def set_limits(self, *, memory_bytes: int, pids: int, cpus: float) -> None:
        if self._limits == (memory_bytes, pids, cpus):
            return
        self._limits = None  # until every write succeeded
        self._write_limits(memory_bytes, pids, cpus)
        self._limits, self._memory = (memory_bytes, pids, cpus), memory_bytes

    def _write_limits(self, memory_bytes: int, pids: int, cpus: float) -> None:
        if self.version == 1:
            mem = self._d("memory")
            memsw = mem / "memory.memsw.limit_in_bytes"
            # limit <= memsw must hold after each write, so the order depends on the direction of the change.
            if memsw.exists():
                try:
                    _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                    _write(memsw, str(memory_bytes))
                except OSError:
                    _write(memsw, str(memory_bytes))
                    _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            else:
                _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            _limit_tcp_v1(mem, memory_bytes)
            if (mem / "memory.swappiness").exists():
                try:
                    _write(mem / "memory.swappiness", "0")
                except OSError:
                    pass
            _write(self._d("pids") / "pids.max", str(pids))
            _write(self._d("cpu") / "cpu.cfs_period_us", "100000")
            _write(self._d("cpu") / "cpu.cfs_quota_us", str(int(cpus * 100000)))
        else:
            d = self._d("memory")
            _write(d / "memory.max", str(memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids))
            if (d / "cpu.max").exists():
                _write(d / "cpu.max", f"{int(cpus * 100000)} 100000")

    def set_memory(self, memory_bytes: int) -> None:
        """The memory limit of one request, and (v1) its peak counter reset."""
        if self.version == 1:
            mem = self._d("memory")
            memsw = mem / "memory.memsw.limit_in_bytes"
            if memory_bytes != self._memory:
                self._memory = None
                try:
                    _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                    if memsw.exists():
                        _write(memsw, str(memory_bytes))
                except OSError:
                    _write(memsw, str(memory_bytes))
                    _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                _limit_tcp_v1(mem, memory_bytes)
                self._memory = memory_bytes
                if self._limits is not None:
                    self._limits = (memory_bytes, *self._limits[1:])
            try:
                _write(mem / "memory.max_usage_in_bytes", "0")
            except OSError:
                pass
        elif memory_bytes != self._memory:
            self._memory = None
            _write(self._d("memory") / "memory.max", str(memory_bytes))
            self._memory = memory_bytes
            if self._limits is not None:
                self._limits = (memory_bytes, *self._limits[1:])

    def counters(self) -> CgroupCounters:
        oom_file, peak_file, pids_file = self._counter_files
        oom = _read_kv(oom_file).get("oom_kill", 0)
        pids_max = _read_kv(pids_file).get("max", 0)
        try:
            peak = int(_read(peak_file))
        except (OSError, ValueError):
            peak = 0
        return CgroupCounters(oom, pids_max, peak)

    @property
    def can_freeze(self) -> bool:
        return self._freeze_file is not None

    def freeze(self) -> None:
        """Stop every process in the cgroup where it stands (they use no CPU until `thaw`); no-op without a
        freezer. The kernel finishes freezing on its own; nothing waits for it."""
        if self._freeze_file is not None and not self.frozen:
            _write(self._freeze_file, "FROZEN" if self.version == 1 else "1")
            self.frozen = True

    def thaw(self) -> None:
        if self._freeze_file is not None and self.frozen:
            _write(self._freeze_file, "THAWED" if self.version == 1 else "0")
            self.frozen = False

    def procs(self) -> set[int]:
        pids: set[int] = set()
        for f in self.procs_files:
            try:
                pids.update(int(p) for p in _read(f).split())
            except FileNotFoundError:
                continue
        return pids

    def kill_pass(self) -> set[int]:
        """One SIGKILL pass over the cgroup's processes; returns those it found (empty: the cgroup is empty)."""
        pids = self.procs()
        if not pids:
            return pids
        self.thaw()  # a frozen process (v1) dies of SIGKILL only once thawed
        kill_file = self._d("memory") / "cgroup.kill" if self.version == 2 else None
        if kill_file is not None and kill_file.exists():
            _write(kill_file, "1")
        else:
            self.signal_procs(pids, signal.SIGKILL)
        return pids

    def signal_procs(self, pids: set[int], sig: int) -> None:
        """Send `sig` to those of `pids` that are in this cgroup, never to a process that took a listed pid after
        its owner exited: each pid is pinned with a pidfd first, then kept only if cgroup.procs still lists it
        (the pidfd then names that very process, or one that has exited, which the signal cannot reach)."""
        pidfds = {}
        for pid in pids:
            try:
                pidfds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError as e:  # no pidfds (Linux < 5.3): nothing else is safe against pid reuse, so skip it
                if e.errno not in (errno.ENOSYS, errno.EINVAL):
                    raise
        try:
            still = self.procs() if pidfds else set()
            for pid, fd in pidfds.items():
                if pid in still:
                    try:
                        signal.pidfd_send_signal(fd, sig)
                    except ProcessLookupError:
                        pass
        finally:
            for fd in pidfds.values():
                os.close(fd)

    def kill_all(self, deadline_s: float = 3.0) -> None:
        """SIGKILL every process in the cgroup until it stays empty; raises CgroupError if it does not."""
        end = time.monotonic() + deadline_s
        while pids := self.kill_pass():
            if time.monotonic() > end:
                raise CgroupError(f"cgroup {self.dirs} still has processes {sorted(pids)[:10]} after SIGKILL")
            time.sleep(0.002)

    async def kill_all_async(self, deadline_s: float = 3.0) -> None:
        """kill_all on the event loop: the passes are quick, the waits between them are asyncio sleeps (growing:
        a killed process leaves its cgroup only once the kernel has torn down its namespaces)."""
        end = time.monotonic() + deadline_s
        delay = 0.001
        while pids := self.kill_pass():
            if time.monotonic() > end:
                raise CgroupError(f"cgroup {self.dirs} still has processes {sorted(pids)[:10]} after SIGKILL")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            _rmdir_retry(d)


def _busy(cg: Cgroup) -> bool:
    """One SIGKILL pass over the cgroup: True while it still holds a process (or cannot be read)."""
    try:
        return bool(cg.kill_pass())
    except OSError:
        return True


class CgroupPool:
    """Pre-created cgroups under a per-service parent (inside this process's own cgroup), recycled."""

    def __init__(self, version: int, size: int, name: str | None = None, uids: range | None = None):
        self.version = version
        self.uids = uids  # host uids, one per cgroup (None: the sandboxes keep the service's uid)
        self.name = name or f"agentrl-sandbox-{os.getpid()}"
        self._free: deque[Cgroup] = deque()
        self._draining: list[Cgroup] = []  # released while the kernel still tears down their last processes
        self._all: list[Cgroup] = []
        self._counter = 0
        if version == 1:
            controllers = V1_CONTROLLERS + ((V1_FREEZER,) if (CGROUP_ROOT / V1_FREEZER / "cgroup.procs").is_file()
                                            else ())
            self.parents = {c: CGROUP_ROOT / c / _own_path(c).lstrip("/") / self.name for c in controllers}
        else:
            self.parents = {"unified": CGROUP_ROOT / _own_path(None).lstrip("/") / self.name}
        self._remove_stale()
        try:
            for parent in self.parents.values():
                parent.mkdir(exist_ok=True)
            if version == 2:
                _write(self.parents["unified"] / "cgroup.subtree_control", "+memory +pids +cpu")
        except OSError as e:
            raise CgroupError(f"cannot create sandbox cgroups under {list(self.parents.values())}: {e}. "
                              "Run the service as root (or with a delegated cgroup subtree)") from e
        for _ in range(size):
            cg = self._create()
            self._free.append(cg)

    def _remove_stale(self) -> None:
        """Remove empty cgroups left by an earlier service that was killed (its pid no longer exists)."""
        for parent in self.parents.values():
            for old in parent.parent.glob("agentrl-sandbox-*"):
                pid = old.name.rsplit("-", 1)[-1]
                if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                    continue
                for child in [c for c in old.iterdir() if c.is_dir()] + [old]:
                    try:
                        if not (child / "cgroup.procs").read_text().strip():
                            _rmdir_retry(child, deadline_s=0.2)
                    except (OSError, CgroupError):
                        continue

    def _create(self) -> Cgroup:
        uid = None
        if self.uids is not None:
            if self._counter >= len(self.uids):
                raise CgroupError(f"every sandbox host uid in {self.uids.start}..{self.uids.stop - 1} is taken: "
                                  "raise host_uid_count")
            uid = self.uids[self._counter]
        self._counter += 1
        dirs = {key: parent / f"s{self._counter}" for key, parent in self.parents.items()}
        for d in dirs.values():
            d.mkdir(exist_ok=True)
        cg = Cgroup(self.version, dirs, uid)
        self._all.append(cg)
        return cg

    def acquire(self) -> Cgroup:
        self.reap()
        return self._free.popleft() if self._free else self._create()

    def release(self, cg: Cgroup, *, emptied: bool = False) -> None:
        """Make the cgroup available again, with its counters as the next use's baseline. A cgroup the caller
        could not empty (its last processes are still being torn down by the kernel, which takes longer under
        load) is not waited for here, on the event loop: it gets one more SIGKILL pass and, if processes remain,
        drains until `reap` finds it empty. No cgroup is retired or reused while it holds a process."""
        if not emptied and _busy(cg):
            self._draining.append(cg)
            return
        self._recycle(cg)

    def reap(self) -> int:
        """Recycle every draining cgroup that is empty now (one SIGKILL pass over the others); returns how many
        still drain. Cheap: one read of cgroup.procs per draining cgroup."""
        still = []
        for cg in self._draining:
            if _busy(cg):
                still.append(cg)
            else:
                self._recycle(cg)
        self._draining = still
        return len(still)

    def _recycle(self, cg: Cgroup) -> None:
        cg.thaw()
        cg.baseline = cg.counters()  # reads what it can: an unreadable counter is 0
        self._free.append(cg)

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def draining(self) -> int:
        return len(self._draining)

    @property
    def in_use(self) -> int:
        """Cgroups holding a sandbox (warm, running or being disposed of); draining ones are not counted."""
        return len(self._all) - len(self._free) - len(self._draining)

    def close(self) -> None:
        errors = []
        for cg in self._all:
            try:
                cg.remove()
            except CgroupError as e:
                errors.append(str(e))
        for parent in self.parents.values():
            try:
                _rmdir_retry(parent)
            except CgroupError as e:
                errors.append(str(e))
        self._all.clear()
        self._free.clear()
        if errors:
            raise CgroupError("; ".join(errors))
