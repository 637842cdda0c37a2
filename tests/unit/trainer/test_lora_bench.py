"""`agentrl bench lora` on a few short sequences: both sides updated and timed, the memory read off the tensors,
and the LoRA side's grads + optimizer state a small share of the full side's."""

from __future__ import annotations

import argparse
import re

import pytest

from agentrl.trainer import lora_bench


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")
def test_bench_lora_reports_memory_and_time_of_both_sides(tiny_model_dir, capsys):
    parser = argparse.ArgumentParser()
    lora_bench.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--rank", "4", "--sequences", "4", "--min-len", "8",
                              "--max-len", "24", "--repeats", "1", "--no-rss"])
    assert lora_bench.run(args) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("full  ", "lora  "))}
    full, lora = (float(rows[side][3]) for side in ("full", "lora"))  # grads + optimizer MiB
    assert 0 < lora < 0.1 * full
    # tiny model: 787,584 parameters (the LM head tied to the embedding); rank 4 on 7 projections x 2 layers
    assert rows["full"][0] == "787,584" and rows["lora"][0] == "19,456"
    assert re.search(r"lora / full: trained parameters 2\.5%, grads \+ optimizer state 2\.\d% \(within the 10% "
                     r"target\), update time \d+\.\d\dx$", out.strip()), out
