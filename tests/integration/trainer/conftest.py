from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every trainer integration test (starting Ray costs ~5-10 s)."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
