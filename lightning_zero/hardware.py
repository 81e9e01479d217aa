"""What this machine can do, and the training precision that fits a CPU run.

``bf16-mixed`` is fast on CPUs with native bf16 instructions (AVX512-BF16 or AMX); elsewhere PyTorch emulates
it, several times slower than ``32-true``. :func:`cpu_precision` picks one from :class:`CpuFacts`, so the
decision is testable with facts of any CPU; :func:`detect_cpu_facts` reads this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

#: The /proc/cpuinfo flags of native bf16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class CpuFacts:
    """What is known about the CPU: its /proc/cpuinfo flags (empty where unreadable) and torch's own checks."""

    flags: frozenset[str] = frozenset()
    torch_avx512_bf16: bool = False
    torch_amx: bool = False


@dataclass(frozen=True)
class PrecisionChoice:
    """A Lightning precision and the reason it was chosen, for one log line."""

    precision: str
    reason: str


def detect_cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    """This machine's facts: the flags of ``cpuinfo`` where it exists, and torch's cpuinfo-based checks."""
    return CpuFacts(
        flags=_cpuinfo_flags(cpuinfo),
        torch_avx512_bf16=_torch_capability("avx512_bf16"),
        torch_amx=_torch_capability("amx_tile"),
    )


def has_native_bf16(facts: CpuFacts) -> bool:
    """Whether the CPU computes in bf16 natively (AVX512-BF16 or AMX), not through fp32 emulation."""
    return bool(facts.flags & BF16_FLAGS) or facts.torch_avx512_bf16 or facts.torch_amx


def cpu_precision(facts: CpuFacts | None = None) -> PrecisionChoice:
    """``bf16-mixed`` where the CPU has native bf16, else ``32-true`` (emulated bf16 is several times slower)."""
    facts = detect_cpu_facts() if facts is None else facts
    if has_native_bf16(facts):
        return PrecisionChoice("bf16-mixed", "this CPU has native bf16 (AVX512-BF16/AMX)")
    return PrecisionChoice(
        "32-true", "this CPU has no native bf16 (AVX512-BF16/AMX): bf16-mixed would be emulated, several times slower"
    )


def _cpuinfo_flags(cpuinfo: Path) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def _torch_capability(name: str) -> bool:
    # What torch's private `torch.cpu._is_<name>_supported` reads; a torch older than the pinned one may lack it,
    # and then the cpuinfo flags alone decide.
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    return bool(capabilities().get(name, False)) if callable(capabilities) else False
