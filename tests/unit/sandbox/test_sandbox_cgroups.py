"""cgroup pool on this host: limits applied, every process killed (daemons too), stale pools removed."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sandbox.cgroups import CgroupPool, detect_version

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or detect_version() is None,
                                reason="needs root and cgroup v1/v2 with memory and pids controllers")


def test_pool_limits_kill_and_cleanup():
    pool = CgroupPool(detect_version(), size=2, name=f"agentrl-sandbox-test-{os.getpid()}")
    try:
        cg = pool.acquire()
        cg.set_limits(memory_bytes=64 << 20, pids=16, cpus=0.5)
        joins = " && ".join(f"echo 0 > {f}" for f in cg.procs_files)
        # a shell that joins the cgroup, then leaves a setsid'd grandchild behind and exits
        subprocess.run(["/bin/sh", "-c", f"{joins} && setsid sleep 4747.5 & sleep 0.2"], check=True, timeout=10)
        time.sleep(0.1)
        assert len(cg.procs()) >= 1  # the daemon is still in the cgroup after its parent exited
        cg.kill_all()
        assert cg.procs() == set()
        pool.release(cg)
        assert pool.in_use == 0 and pool.total == 2
    finally:
        pool.close()
    assert not any(p.exists() for p in pool.parents.values())


def test_a_cgroup_released_before_it_is_empty_drains_and_is_not_reused_until_empty():
    """The kernel may still be tearing a sandbox's last processes down when it is disposed of (slow under load):
    release must neither block nor hand the cgroup out while it holds a process, nor leak it. How long the kernel
    takes is not up to the test: the cgroup reports a process until the test says it is gone."""
    pool = CgroupPool(detect_version(), size=1, name=f"agentrl-sandbox-test3-{os.getpid()}")
    try:
        cg = pool.acquire()
        tearing_down = {4747}
        cg.kill_pass = lambda: set(tearing_down)  # what a pass finds while the kernel is still at work
        pool.release(cg)  # one kill pass, no wait
        assert pool.draining == 1 and pool.in_use == 0
        other = pool.acquire()
        assert other is not cg and pool.total == 2  # a draining cgroup is never handed out
        assert pool.reap() == 1 and pool.draining == 1  # still holding a process: still draining
        tearing_down.clear()  # the last process is gone
        assert pool.reap() == 0 and pool.draining == 0
        pool.release(other)
        assert pool.in_use == 0 and {pool.acquire(), pool.acquire()} == {cg, other}
    finally:
        pool.close()


def test_signals_reach_only_processes_in_the_cgroup():
    """A pid read from cgroup.procs may belong to another process by the time it is signalled (its owner exited
    and the pid was reused): signal_procs pins each pid and re-checks the cgroup, so a process outside is never
    hit, whatever pids it is handed."""
    pool = CgroupPool(detect_version(), size=1, name=f"agentrl-sandbox-test4-{os.getpid()}")
    outside = subprocess.Popen(["sleep", "4848.6"])
    try:
        cg = pool.acquire()
        joins = " && ".join(f"echo 0 > {f}" for f in cg.procs_files)
        inside = subprocess.Popen(["/bin/sh", "-c", f"{joins} && exec sleep 4848.7"])
        while not cg.procs():
            time.sleep(0.01)
        cg.signal_procs({outside.pid, *cg.procs()}, signal.SIGKILL)  # as if the outside pid had been read there
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert outside.poll() is None  # untouched
    finally:
        outside.kill()
        outside.wait()
        pool.close()


def test_stale_pool_of_a_dead_service_is_removed():
    stale = CgroupPool(detect_version(), size=1, name="agentrl-sandbox-999999999")  # no such pid
    try:
        fresh = CgroupPool(detect_version(), size=1, name=f"agentrl-sandbox-test2-{os.getpid()}")
        fresh.close()
        assert not any(p.exists() for p in stale.parents.values())
    finally:
        stale._all.clear()
        for p in stale.parents.values():
            if p.exists():
                for child in p.iterdir():
                    if child.is_dir():
                        child.rmdir()
                p.rmdir()
