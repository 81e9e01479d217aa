"""A bad ``--ckpt_path`` is one ``error:`` line and exit code 2, before any process is launched; consolidation's
bad input, and its Hugging Face export with a tokenizer.

The CLI runs in this process: ``main`` returns the exit status that ``main.py`` and the ``lightning-zero`` script
exit with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoTokenizer, GPT2LMHeadModel, PreTrainedTokenizerFast

from lightning_zero.app.cli import main
from lightning_zero.app.consolidate import consolidate
from lightning_zero.app.hf_export import write_hf_dir
from lightning_zero.checkpoint.hf import hf_record
from lightning_zero.checkpoint.manifest import MANIFEST_NAME, Manifest, ModelSignature, write_manifest
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.errors import ZeroConfigError
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import quiet_trainer

TINY = "tests/data/cli_tiny.yaml"


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "one-step.ckpt"
    trainer = quiet_trainer(
        devices=1,
        max_steps=1,
    )
    trainer.fit(TinyLM())
    trainer.save_checkpoint(path)
    return path


def fit_with(checkpoint: Path | str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI's tiny job in this process with ``--ckpt_path``; return the one error line it printed."""
    args = ["fit", "--config", TINY, "--trainer.devices", "1", "--trainer.strategy", "ddp"]
    status = main([*args, "--ckpt_path", str(checkpoint)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:]
    assert not any("Traceback" in line for line in lines)
    return lines[-1]


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "does not exist" in fit_with(tmp_path / "nope.ckpt", capsys)


def test_a_save_that_did_not_finish_is_named(tmp_path: Path) -> None:
    (tmp_path / "step=4.ckpt.partial").mkdir()
    with pytest.raises(ZeroConfigError, match="did not finish"):
        check_checkpoint(tmp_path / "step=4.ckpt")


def test_garbage_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"\x00\xffnot a checkpoint" * 100)
    assert "not a torch checkpoint" in fit_with(garbage, capsys)


def test_truncated_file(good_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truncated = tmp_path / "truncated.ckpt"
    data = good_checkpoint.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    assert "truncated" in fit_with(truncated, capsys)


def another_model(good_checkpoint: Path, path: Path, hyper_parameters: dict[str, object]) -> Path:
    content = torch.load(good_checkpoint, weights_only=True)
    content["state_dict"]["model.transformer.wte.weight"] = torch.zeros(50, 8)
    content["hyper_parameters"] = hyper_parameters
    torch.save(content, path)
    return path


def test_another_models_checkpoint(good_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fit_with(another_model(good_checkpoint, tmp_path / "other.ckpt", {}), capsys)
    assert "another model" in line and "model.transformer.wte.weight (50, 8)" in line


def test_another_models_hyper_parameters(
    good_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = another_model(good_checkpoint, tmp_path / "other.ckpt", {"n_experts": 8})
    assert "hyper-parameters that this model config does not take" in fit_with(path, capsys)


def test_another_tools_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = tmp_path / "pytorch_model.bin"
    torch.save(TinyLM().state_dict(), weights)
    assert "not a Lightning checkpoint" in fit_with(weights, capsys)


def test_another_tools_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    TinyLM().model.save_pretrained(tmp_path / "hf")
    assert "not a checkpoint" in fit_with(tmp_path / "hf", capsys)


def sharded(tmp_path: Path, model: ModelSignature) -> Path:
    directory = tmp_path / "sharded.ckpt"
    (directory / "checkpoint").mkdir(parents=True)
    (directory / "checkpoint" / "shard_0.pt").write_bytes(b"x" * 100)
    files = {"checkpoint/shard_0.pt": 100}
    write_manifest(directory, Manifest("sharded.ckpt", 5, 0, 2, "deepspeed", 3, "32-true", model, files))
    return directory


def test_cut_short_shard(tmp_path: Path) -> None:
    directory = sharded(tmp_path, ModelSignature("TinyLM", 1, "0"))
    (directory / "checkpoint" / "shard_0.pt").write_bytes(b"x" * 10)
    with pytest.raises(
        ZeroConfigError, match=re.escape("damaged: 'checkpoint/shard_0.pt' has 10 bytes, its manifest says 100")
    ):
        check_checkpoint(directory)


@pytest.mark.parametrize("inside", ["checkpoint", "checkpoint/shard_0.pt"])
def test_a_path_inside_a_sharded_checkpoint_names_its_directory(tmp_path: Path, inside: str) -> None:
    directory = sharded(tmp_path, ModelSignature("TinyLM", 1, "0"))
    with pytest.raises(ZeroConfigError, match=re.escape(f"load using this parent directory instead: {directory}")):
        check_checkpoint(directory / inside)


def test_sharded_checkpoint_of_another_model(tmp_path: Path) -> None:
    directory = sharded(tmp_path, ModelSignature("BigLM", 10**9, "feedbeef"))
    with pytest.raises(
        ZeroConfigError, match=re.escape("another model (BigLM with 1,000,000,000 parameters; this is TinyLM")
    ):
        check_checkpoint(directory, TinyLM())


def test_unreadable_manifest(tmp_path: Path) -> None:
    directory = sharded(tmp_path, ModelSignature("TinyLM", 1, "0"))
    (directory / MANIFEST_NAME).write_text(json.dumps({"tag": 1}))
    with pytest.raises(ZeroConfigError, match="not a lightning-zero manifest"):
        check_checkpoint(directory)


def test_good_checkpoint_passes(good_checkpoint: Path) -> None:
    check_checkpoint(good_checkpoint, TinyLM())


def test_consolidate_rejects_an_output_it_cannot_name_the_format_of(good_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ZeroConfigError, match=r"must end in \.safetensors or \.pt"):
        consolidate(good_checkpoint, tmp_path / "model.bin")


def test_consolidate_command_on_a_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["consolidate", str(tmp_path / "none.ckpt"), str(tmp_path / "out.pt")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: Checkpoint")


class WithTokenizer(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        words = WordLevel(vocab={"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]")
        backend = Tokenizer(words)
        backend.pre_tokenizer = Whitespace()
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def test_hf_dir_carries_config_weights_and_tokenizer(tmp_path: Path) -> None:
    module = WithTokenizer()
    record = hf_record(module)
    assert record is not None and record["attribute"] == "model" and record["class"] == "GPT2LMHeadModel"
    write_hf_dir(record, module.state_dict(), tmp_path, torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer("hello world")["input_ids"] == [1, 2]
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert max_difference(loaded.state_dict(), module.model.state_dict()) == 0.0


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


def test_a_plain_checkpoint_fits_the_same_model_with_checkpointed_blocks(tmp_path: Path) -> None:
    """Activation checkpointing wraps the blocks (their parameters' names gain a prefix) but not the state dict's
    names, which the check compares."""
    from lightning_zero.runtime.blocks import prepare_blocks
    from tests.test_fabric_onecard import Regressor  # a module of repeated blocks

    path = tmp_path / "plain.ckpt"
    torch.save({"state_dict": Regressor().state_dict(), "pytorch-lightning_version": "2.6.6"}, path)
    wrapped = Regressor()
    prepare_blocks(wrapped, checkpointing=True, compiling=False)
    assert any("_checkpoint_wrapped_module" in name for name, _ in wrapped.named_parameters())
    check_checkpoint(path, wrapped)
