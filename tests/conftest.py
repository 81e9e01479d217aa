import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import lightning_zero  # noqa: F401  (registers the presets for every test)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
