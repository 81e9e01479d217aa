"""Multi-node through Lightning's cluster environments, on one host: 2 nodes x 1 CPU process (gloo, loopback)
under torchrun and under SLURM's environment match 1 node x 2 processes, for a DeepSpeed, a FairScale and an
FSDP2 preset (several strategies per launch)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.launch import REPO, run_script

pytestmark = pytest.mark.multiprocess  # every test here starts processes

SCRIPT = REPO / "tests" / "helpers" / "multinode_run.py"
STRATEGIES = ["zero2", "zero2_fairscale", "zero3_fsdp"]
TIMEOUT = 420


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This process's environment without any launcher's or cluster's variables."""
    prefixes = ("SLURM_", "TORCHELASTIC_", "PL_", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_", "NODE_")
    return {key: value for key, value in os.environ.items() if not key.startswith(prefixes)}


def run_nodes(commands: list[list[str]], envs: list[dict[str, str]]) -> list[str]:
    """Start one process per node; wait for all under a hard timeout that kills every node's process group."""
    processes = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for command, env in zip(commands, envs, strict=True)
    ]
    outputs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT)
            outputs.append(output)
            assert process.returncode == 0, output[-4000:]
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return outputs


def node_args(out: Path) -> list[str]:
    return [str(SCRIPT), str(out), "--nodes", "2", "--devices", "1", "--strategies", *STRATEGIES]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("one-node")
    run_script(SCRIPT, str(out), "--nodes", "1", "--devices", "2", "--strategies", *STRATEGIES, timeout=TIMEOUT)
    return torch.load(out / "losses-1x2.pt")


def assert_parity(one_node: dict, two_nodes: dict, environment: str) -> None:
    for strategy in STRATEGIES:
        losses, chosen = two_nodes[strategy]
        assert chosen == environment, strategy
        assert len(losses) == 4
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(one_node[strategy][0]), rtol=0, atol=1e-6)


def test_torchrun_two_nodes_match_one_node(one_node: dict, tmp_path: Path) -> None:
    port = str(free_port())
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port, *node_args(tmp_path)]
        for rank in (0, 1)
    ]  # fmt: skip
    run_nodes(commands, [clean_env(), clean_env()])
    assert_parity(one_node, torch.load(tmp_path / "losses-2x1.pt"), "TorchElasticEnvironment")


def slurm_env(rank: int, port: int) -> dict[str, str]:
    """What SLURM sets for task ``rank`` of ``srun --nodes 2 --ntasks-per-node 1`` (nodes on this host)."""
    return {
        **clean_env(),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "lightning-zero-multinode",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(rank),
        "MASTER_PORT": str(port),
    }


def test_slurm_two_nodes_match_one_node(one_node: dict, tmp_path: Path) -> None:
    port = free_port()
    commands = [[sys.executable, *node_args(tmp_path)] for _ in (0, 1)]
    run_nodes(commands, [slurm_env(rank, port) for rank in (0, 1)])
    assert_parity(one_node, torch.load(tmp_path / "losses-2x1.pt"), "SLURMEnvironment")
