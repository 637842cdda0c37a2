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
