"""CPU kernels pinned to one code path, so that runs repeat on other machines of the same CPU vendor.

A training run on CPU computes other floats on another machine by default: PyTorch picks its vectorised ATen
kernels (softmax, reductions, elementwise ops) and MKL its GEMM and vector-math code path for the CPU it runs on
(AVX-512 on one host, AVX2 on another), they round differently in the last bit, and a few hundred optimizer steps
amplify that into a different model. MKL's AVX2 branch outside strict mode also splits a GEMM by the number of
threads it runs (on an Intel host, 1 and 2 threads gave different weights after 30 SFT steps), so even the core
count changed the model. `pin_cpu_kernels()` selects the AVX2 kernels of ATen (`ATEN_CPU_CAPABILITY=avx2`) and
MKL's AVX2 branch in strict mode (`MKL_CBWR=AVX2,STRICT`: the same results whatever the thread count; no cost
measurable here).

What that buys, measured (docs/quickstart.md#reproducibility-sft-per-machine-and-per-cpu-vendor): two AMD EPYC
hosts, one with AVX-512 and one with AVX2 only, train the same SFT model; an Intel Xeon host trains another.
MKL honours a named branch such as AVX2 on Intel CPUs only; on other vendors it runs its AUTO branch, so AMD and
Intel hosts compute different GEMMs (and `torch.exp`) even pinned. The one branch MKL keeps identical across
vendors, `MKL_CBWR=COMPATIBLE` (SSE2 without approximate reciprocals), made the tiny model's training step 2.2x
and a decode step 1.7x slower here, so it is not the default; set it yourself (a value you set is kept) to trade
that time for one model on Intel and AMD alike. Pinning only sets what the user has not set, and must run before
torch is first used (child processes, Ray workers included, inherit the environment).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_flags(info: str) -> set[str]:
    """The first processor's feature flags in /proc/cpuinfo text (every core lists the same)."""
    return set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))


def _has_avx2() -> bool:
    return {"avx2", "fma"} <= _cpu_flags(_cpuinfo())


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under `taskset`), else the host's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pin_cpu_kernels() -> dict[str, str]:
    """Select the AVX2 kernels of ATen and MKL's strict AVX2 branch (environment defaults, never overriding a user's
    value) on an x86-64 CPU with AVX2; returns the variables set now ({} elsewhere, or when already set)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not _has_avx2():
        return {}
    changed = {}
    for key, value in PINNED_KERNELS.items():
        if key not in os.environ:
            os.environ[key] = value
            changed[key] = value
    return changed


def cpu_kernels() -> str:
    """What this process computes with, for reports: torch's CPU capability and the MKL branch in force."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return f"ATen {capability}, MKL_CBWR={os.environ.get('MKL_CBWR', 'unset (CPU default)')}"


def host_cpu() -> str:
    """The CPU this process runs on, for reports: model name, usable cores, and its widest x86 vector unit
    ("AMD EPYC, 2 cores, AVX-512"); run times and, unpinned, the floats depend on it."""
    info = _cpuinfo()
    names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
    flags = _cpu_flags(info)
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    return f"{names[0] if names else platform.processor() or 'unknown CPU'}, {usable_cores()} cores, {vector}"


__all__ = ["PINNED_KERNELS", "cpu_kernels", "host_cpu", "pin_cpu_kernels", "usable_cores"]
