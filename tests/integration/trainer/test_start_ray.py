"""`start_ray` runs Ray's workers (the trainer ranks) at the driver's priority, not Ray's default niceness 15, which
starved them whenever another job wanted the CPU; a user's `RAY_worker_niceness` still wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import os, ray
from agentrl.trainer.fsdp import start_ray
assert start_ray(num_cpus=1, log_to_driver=False)

@ray.remote
def niceness():
    return os.nice(0)

print("niceness", os.nice(0), ray.get(niceness.remote()))
ray.shutdown()
"""


@pytest.mark.parametrize("user_setting,expected", [(None, 0), ("7", 7)])
def test_ray_workers_run_at_the_drivers_priority(user_setting, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    if user_setting is not None:
        env["RAY_worker_niceness"] = user_setting
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    driver, worker = (int(x) for x in out.stdout.split("niceness", 1)[1].split())
    assert worker == driver + expected


def test_a_local_start_ignores_another_ray_on_the_host():
    """trainer.ray_address unset means a Ray of the run's own: not the newest one on the host (RAY_ADDRESS, or
    /tmp/ray/ray_current_cluster while another job's cluster runs), which `ray.init()` alone would join."""
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}  # an address where no Ray listens
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
