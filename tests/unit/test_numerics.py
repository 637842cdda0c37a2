"""Pinned CPU kernels: set only what the user has not set, inherited by child processes, in force there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentrl import numerics
from agentrl.quickstart.recipe import load_recipe


def test_pin_sets_only_unset_variables(monkeypatch):
    monkeypatch.setattr(numerics, "_has_avx2", lambda: True)
    monkeypatch.setattr(numerics.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # the user's choice stays
    assert numerics.pin_cpu_kernels() == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["MKL_CBWR"] == "COMPATIBLE"
    assert numerics.pin_cpu_kernels() == {}  # already set: nothing changes


def test_pin_does_nothing_off_x86(monkeypatch):
    monkeypatch.setattr(numerics.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert numerics.pin_cpu_kernels() == {} and "ATEN_CPU_CAPABILITY" not in os.environ


def run_unpinned_child(code: str, **env: str) -> str:
    """stdout of `code` in a fresh interpreter whose environment has none of the pinned variables (plus `env`)."""
    base = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_KERNELS}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not numerics._has_avx2(), reason="needs an x86-64 CPU with AVX2")
def test_a_child_process_computes_with_the_pinned_kernels():
    code = "from agentrl.numerics import pin_cpu_kernels, cpu_kernels; pin_cpu_kernels(); print(cpu_kernels())"
    assert run_unpinned_child(code) == "ATen AVX2, MKL_CBWR=AVX2,STRICT"


@pytest.mark.skipif(not numerics._has_avx2() or "GenuineIntel" not in numerics._cpuinfo(),
                    reason="MKL runs a named branch (AVX2, strict) on Intel CPUs with AVX2 only")
def test_pinned_gemms_do_not_depend_on_the_thread_count():
    """MKL's AVX2 branch outside strict mode splits a GEMM with a long inner dimension (the LM head's weight
    gradient: vocabulary x tokens @ tokens x hidden) by thread count, and on an Intel host 30 SFT steps at 1 and 2
    threads gave other weights; the strict branch the pin selects gives the same bits at any count."""
    code = ("from agentrl.numerics import pin_cpu_kernels; pin_cpu_kernels()\n"
            "import hashlib, torch\n"
            "g = torch.Generator().manual_seed(0)\n"
            "grad, hidden = torch.randn(6400, 3066, generator=g), torch.randn(6400, 128, generator=g)\n"
            "print(hashlib.sha256((grad.T @ hidden).numpy().tobytes()).hexdigest())")
    digests = {run_unpinned_child(code, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads) for threads in ("1", "2")}
    assert len(digests) == 1


def test_the_quickstart_pins_by_default():
    assert load_recipe().pin_kernels is True


def test_host_cpu_names_the_model_cores_and_vector_unit(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n")
    real_path = numerics.Path
    monkeypatch.setattr(numerics, "Path", lambda p: real_path(cpuinfo) if p == "/proc/cpuinfo" else real_path(p))
    monkeypatch.setattr(numerics.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert numerics.host_cpu() == "AMD EPYC, 2 cores, AVX2"
    cpuinfo.write_text(cpuinfo.read_text().replace("avx2", "avx2 avx512f"))
    assert numerics.host_cpu() == "AMD EPYC, 2 cores, AVX-512"
