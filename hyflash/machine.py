"""Facts about this machine that decisions read: whether bf16 pays, how many physical cores, which CPU.

Each is measured or read here once; calibration (cost curves), training (autocast) and the command line
(thread count) ask this module rather than finding out for themselves.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@functools.lru_cache(maxsize=None)
def bf16_matmul_pays(device: torch.device) -> bool:
    """Whether bf16 matrix products beat float32's here: on a GPU, yes; on a CPU, timed once per process at a
    drafter training step's size. AMX runs bf16 natively; AVX2 CPUs emulate it, and there bf16 made a drafter's
    training step 15-21x slower and the target's pass 6x slower (AMD EPYC, experiments/training-speed/epyc-avx2)."""
    if device.type != "cpu":
        return True
    a, b = torch.randn(2048, 576), torch.randn(576, 1536)

    def best(x, y) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    return best(a.bfloat16(), b.bfloat16()) < best(a, b)


def auto_dtype(dtype: str, device: torch.device) -> str:
    """A dtype setting made concrete: 'auto' is bfloat16 where bf16 products pay (`bf16_matmul_pays`), else
    float32; any other name is returned as given."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if bf16_matmul_pays(device) else "float32"


def cpu_description() -> tuple[str, str]:
    """(CPU model name, sha256 of its flags): what makes a cost curve valid on another machine."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = value.strip()
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), hashlib.sha256(flags.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds since boot: the machine's in all and busy (/proc/stat, steal counted busy), and this process's."""

    total: float
    busy: float
    own: float


def cpu_times() -> CpuTimes | None:
    """The machine's and this process's CPU time now; None where /proc/stat cannot be read (not Linux)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    user, nice, system, idle, iowait, irq, softirq, steal = fields + [0.0] * (8 - len(fields))
    own = os.times()
    return CpuTimes(total=sum(fields) / tick, busy=(user + nice + system + irq + softirq + steal) / tick,
                    own=own.user + own.system)


def others_cpu_share(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """The share of the machine's CPU time between two readings that went to other processes (or was stolen by
    the hypervisor): what makes a timing taken then slower than this machine is. None if unknown."""
    if before is None or after is None or after.total <= before.total:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / (after.total - before.total)))


def physical_cores() -> int:
    """Cores this process may run on, counting hyperthread siblings once: torch's best thread count for
    decoding (a sibling shares the core's vector units, so a second thread on it only adds contention)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "processor":
                cpu = int(value)
            elif key == "physical id":
                phys = value
            elif key == "core id" and cpu in allowed:
                cores.add((phys, value))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


def chosen_threads() -> int | None:
    """The thread count the user chose in the environment (HYFLASH_THREADS, else OMP_NUM_THREADS), or None."""
    chosen = os.environ.get("HYFLASH_THREADS") or os.environ.get("OMP_NUM_THREADS")
    return int(chosen) if chosen and chosen.isdigit() and int(chosen) > 0 else None


def set_torch_threads() -> None:
    """One torch thread per physical core unless the user chose (`chosen_threads`): decoding a small model is
    bound by the cores' vector units, and hyperthread siblings only contend."""
    torch.set_num_threads(chosen_threads() or physical_cores())
