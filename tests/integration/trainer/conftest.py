from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every trainer integration test (starting Ray costs ~5-10 s)."""
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def calc_tasks(tmp_path_factory):
    """Calc-suite prompts scored by the parity of the first sampled token (reward type "parity", defined by
    `train_rewards:first_token_parity`), so a random model's groups differ."""
    from agentrl.data.suites import write_suite

    root = tmp_path_factory.mktemp("calc")
    paths = {}
    for split, n in (("train", 16), ("heldout", 4)):
        raw = write_suite("calc", split, n, root / f"raw-{split}.jsonl", seed=0)[0]
        rows = [json.loads(line) for line in raw.read_text().splitlines()]
        for row in rows:
            row["reward"] = {"type": "parity"}
        paths[split] = root / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths
