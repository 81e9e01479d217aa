"""Precision that fits the CPU: bf16-mixed only with native bf16, else 32-true; the user's choice wins."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightning_zero import hardware
from lightning_zero.app import preflight
from lightning_zero.hardware import CpuFacts, cpu_precision, detect_cpu_facts, has_native_bf16
from tests.helpers.launch import REPO
from tests.test_cli import CPU_TWINS, parse

AVX2_ONLY = CpuFacts(flags=frozenset({"avx2", "fma", "avx512f"}))
WITH_AVX512_BF16 = CpuFacts(flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))
WITH_AMX = CpuFacts(flags=frozenset({"avx2", "amx_tile", "amx_bf16"}))


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (AVX2_ONLY, "32-true"),
        (CpuFacts(), "32-true"),
        (WITH_AVX512_BF16, "bf16-mixed"),
        (WITH_AMX, "bf16-mixed"),
        (CpuFacts(torch_avx512_bf16=True), "bf16-mixed"),
        (CpuFacts(torch_amx=True), "bf16-mixed"),
    ],
    ids=["avx2", "unknown", "avx512_bf16", "amx", "torch-avx512_bf16", "torch-amx"],
)
def test_bf16_only_where_the_cpu_has_it(facts: CpuFacts, expected: str) -> None:
    choice = cpu_precision(facts)
    assert choice.precision == expected
    assert ("no native bf16" in choice.reason) == (expected == "32-true")


def test_cpuinfo_flags_are_read_from_every_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert {"avx2", "avx512_bf16"} <= detect_cpu_facts(cpuinfo).flags
    assert has_native_bf16(CpuFacts(flags=detect_cpu_facts(cpuinfo).flags))


def test_an_unreadable_cpuinfo_leaves_torch_to_decide(tmp_path: Path) -> None:
    assert detect_cpu_facts(tmp_path / "missing").flags == frozenset()


def test_this_machine_agrees_with_proc_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    text = cpuinfo.read_text()
    native = "avx512_bf16" in text or "amx_bf16" in text
    assert cpu_precision().precision == ("bf16-mixed" if native else "32-true")


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "detect_cpu_facts", lambda: AVX2_ONLY)


@pytest.fixture
def cpu_with_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "detect_cpu_facts", lambda: WITH_AMX)


QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


@pytest.mark.usefixtures("cpu_without_bf16")
def test_quickstart_takes_32_true_without_bf16_and_says_why_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        cli = parse("--config", QUICKSTART)
    assert cli.config.trainer.precision == "32-true"
    notices = [record.getMessage() for record in caplog.records if "Precision" in record.getMessage()]
    assert len(notices) == 1 and "no native bf16" in notices[0], notices


@pytest.mark.usefixtures("cpu_with_bf16")
def test_quickstart_takes_bf16_with_native_bf16() -> None:
    assert parse("--config", QUICKSTART).config.trainer.precision == "bf16-mixed"


@pytest.mark.usefixtures("cpu_with_bf16")
def test_the_user_can_force_32_true() -> None:
    cli = parse("--config", QUICKSTART, "--trainer.precision", "32-true")
    assert cli.config.trainer.precision == "32-true"


@pytest.mark.usefixtures("cpu_without_bf16")
def test_the_user_can_force_bf16() -> None:
    cli = parse("--config", QUICKSTART, "--trainer.precision", "bf16-mixed")
    assert cli.config.trainer.precision == "bf16-mixed"


@pytest.mark.parametrize("config", [*CPU_TWINS, REPO / "configs" / "quickstart.yaml"], ids=lambda path: path.stem)
def test_cpu_configs_leave_precision_to_the_machine(config: Path) -> None:
    assert "\n  precision:" not in config.read_text()
    assert parse("--config", str(config)).config.trainer.precision == cpu_precision().precision


def test_gpu_runs_are_left_alone() -> None:
    trainer: dict[str, object] = {"accelerator": "gpu", "precision": None}
    preflight.default_cpu_precision(trainer)
    assert trainer["precision"] is None
