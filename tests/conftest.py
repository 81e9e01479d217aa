import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import lightning_zero  # noqa: F401  (registers the presets for every test)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.launch import run_script
from tests.helpers.shared_launch import STEPS, SharedLaunch, wanted_runs


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine, two OpenMP threads per process run ~10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer cache shared by one module's tests (a trained BPE is reused, not retrained)."""
    return str(tmp_path_factory.mktemp("tokenizers"))


#: What a run in the test process leaves in the environment for the processes launched after it.
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")


@pytest.fixture(autouse=True)
def fresh_rendezvous() -> Iterator[None]:
    """A fit in the test process sets ``MASTER_PORT`` and keeps its store listening there: a 2-process run launched
    by a later test would inherit the port and fail to bind it (EADDRINUSE). Each test leaves the variables as found."""
    before = {name: os.environ.get(name) for name in _RENDEZVOUS}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_REPO = Path(__file__).resolve().parents[1]


def _started_a_python(event: str, args: tuple[object, ...]) -> None:
    if event == "subprocess.Popen" and args[0] == sys.executable and _started_by_this_repository():
        _PYTHONS_STARTED.append(str(args[1]))


def _started_by_this_repository() -> bool:
    """Whether the code that called into ``subprocess`` is this repository's (a test, a helper, the package or a
    benchmark), not a library's own probe (an upstream import runs ``python -c`` to read ``sys.path``)."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == subprocess.__file__:
        frame = frame.f_back
    caller = Path(frame.f_code.co_filename) if frame is not None else None
    return caller is not None and caller.is_relative_to(_REPO) and ".venv" not in caller.parts


#: Python processes started by the test being set up or run (an audit hook sees every ``subprocess.Popen``, so a
#: launch through ``run_script``, ``subprocess.run`` or a harness is seen alike; audit hooks cannot be removed).
_PYTHONS_STARTED: list[str] = []
sys.addaudithook(_started_a_python)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _check_marked(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _check_marked(item)


def _check_marked(item: pytest.Item) -> Iterator[None]:
    """Fail a test that starts a Python process (itself or through a fixture) without the ``multiprocess`` marker,
    so ``make test-fast`` (``-m "not multiprocess and not slow"``) stays free of launches."""
    _PYTHONS_STARTED.clear()
    yield
    if _PYTHONS_STARTED and item.get_closest_marker("multiprocess") is None:
        pytest.fail(f"{item.nodeid} started {_PYTHONS_STARTED[0]!r}: mark it @pytest.mark.multiprocess", pytrace=False)


_HELPERS = _REPO / "tests" / "helpers"


@pytest.fixture(scope="session")
def backend_launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    """helpers/backend_runs.py, STEPS steps: the ``BACKEND_RUNS`` of every module that uses this fixture in one
    2-process launch, then their ``BACKEND_LOADS`` (1 process, of checkpoints the first launch saved) in another."""
    out = tmp_path_factory.mktemp("backend_runs")
    runs = wanted_runs(request.session, "backend_launch", "BACKEND_RUNS")
    outputs = [run_script(_HELPERS / "backend_runs.py", str(out), "--steps", str(STEPS), "--runs", *runs, timeout=1200)]
    if loads := wanted_runs(request.session, "backend_launch", "BACKEND_LOADS"):
        arguments = ["--devices", "1", "--steps", str(STEPS), "--runs", *loads]
        outputs.append(run_script(_HELPERS / "backend_runs.py", str(out), *arguments, timeout=300))
    return SharedLaunch.of(out, outputs)


@pytest.fixture(scope="session")
def parity_launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    """helpers/parity_run.py, STEPS steps: the ``PARITY_RUNS`` of every module that uses this fixture, one launch."""
    out = tmp_path_factory.mktemp("parity_runs")
    runs = wanted_runs(request.session, "parity_launch", "PARITY_RUNS")
    output = run_script(
        _HELPERS / "parity_run.py", str(out), "--steps", str(STEPS), "--strategies", *runs, timeout=1200
    )
    return SharedLaunch.of(out, [output])
