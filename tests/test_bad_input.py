"""Bad input: the CLI ends with exit 2 and one `error:` line that names what is wrong and what to do.

Most cases run in-process through `main` (a launch would fail the test: they are caught before any rank
starts); a few run as real processes to prove there is no traceback and no wait.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from lightning_zero.app.cli import main
from lightning_zero.errors import ZeroConfigError
from lightning_zero.quiet import quiet_libraries
from lightning_zero.strategies.deepspeed import ZeroStrategy
from tests.helpers.launch import REPO, side_by_side

TINY = ["fit", "--config", str(REPO / "tests" / "data" / "cli_tiny.yaml")]
QUICKSTART = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml")]
FILES_DATA = [
    "--model.init_args.model=shape:tiny-deberta-v2",
    "--model.init_args.tokenizer=sentence-transformers/all-MiniLM-L6-v2",
    "--data=lightning_zero.app.data.text_files.TextClassificationFilesDataModule",
    "--data.init_args.tokenizer=sentence-transformers/all-MiniLM-L6-v2",
]
#: The longest error line, `error: ` included: it fits a wide terminal's line or two and still names the fix.
MAX_LINE = 300
#: Errors found in the data module's `setup`: one process, no launch, so the test can see them.
IN_PROCESS = ["--trainer.devices=1", "--trainer.strategy=auto", "--trainer.logger=false", "--trainer.callbacks=null"]


@pytest.fixture(autouse=True)
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must be caught before any rank starts: launching fails the test."""

    def launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("the ranks were launched before the bad input was caught")

    monkeypatch.setattr(_SubprocessScriptLauncher, "launch", launch)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored (removed) after the test: `seed_everything` sets it
    monkeypatch.delenv("PL_GLOBAL_SEED")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def strategy_file(tmp_path: Path, name: str, init_args: str) -> str:
    return write(tmp_path, name, f"class_path: lightning_zero.ZeroStrategy\ninit_args:\n{init_args}")


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI in-process; return its one `error:` line after checking the exit status and the rest."""
    status = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2, err[-2000:]
    assert len(errors) == 1, err[-2000:]
    assert "Traceback" not in err
    assert len(errors[0]) <= MAX_LINE, f"{len(errors[0])} characters: {errors[0]}"
    return errors[0]


# (id, argv builder, fragments the error line must hold: what is wrong, what to do)
def cases(tmp_path: Path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    ds = strategy_file
    both = "  zero: {stage: 2}\n  deepspeed_config: {train_micro_batch_size_per_gpu: 1}\n"
    bad_json = write(tmp_path, "bad.json", '{"train_micro_batch_size_per_gpu": \n')
    rows = write(tmp_path, "rows.json", '"just a string"')
    labels = write(tmp_path, "labels.csv", "text,label\nfine,1\n")
    section_typo = write(tmp_path, "ds-section.json", '{"zero_optimisation": {"stage": 3}}')
    key_typo = write(tmp_path, "ds-key.yaml", "zero_optimization:\n  stage: 3\n  stage3_prefetch_bucket_sizee: 1\n")
    accumulation = write(tmp_path, "ds-accumulation.json", '{"gradient_accumulation_steps": 4}')
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("text,label\nun café,1\n".encode("latin-1"))  # the é is byte 17
    return {
        "devices-0": ([*TINY, "--trainer.devices", "0"], ("`trainer.devices` is '0'", "at least 1")),
        "devices-negative": ([*TINY, "--trainer.devices", "-3"], ("`trainer.devices` is '-3'", "-1 for all")),
        "devices-word": ([*TINY, "--trainer.devices", "abc"], ("'abc'", "'auto'")),
        "devices-empty-list": ([*TINY, "--trainer.devices", "[]"], ("empty list", "at least one device")),
        "accelerator-gpu-without-gpu": ([*TINY, "--trainer.accelerator", "gpu"], ("no CUDA GPU", "accelerator cpu")),
        "accelerator-cuda-without-gpu": ([*TINY, "--trainer.accelerator", "cuda"], ("no CUDA GPU", "accelerator cpu")),
        "accelerator-tpu-without-tpu": ([*TINY, "--trainer.accelerator", "tpu"], ("no TPU", "'cpu'")),
        "accelerator-unknown": ([*TINY, "--trainer.accelerator", "quantum"], ("'quantum'", "use one of", "cpu")),
        "fp16-deepspeed-cpu": ([*TINY, "--trainer.precision", "16-mixed"], ("fp16", "DeepSpeed", "bf16-mixed")),
        "val-check-interval-over-the-epoch": (  # Lightning checks it in the fit loop, once the run has started
            [
                *TINY,
                "--trainer.devices",
                "1",
                "--trainer.strategy",
                "auto",
                "--trainer.val_check_interval",
                "1000",
                "--trainer.default_root_dir",
                str(tmp_path),
            ],
            ("`val_check_interval` (1000)", "set `check_val_every_n_epoch=None`."),
        ),
        "fp16-true-offload-cpu": (
            [*TINY, "--trainer.strategy", "zero3_offload", "--trainer.precision", "16-true"],
            ("fp16", "32-true"),
        ),
        "precision-64-deepspeed": (
            [*TINY, "--trainer.precision", "64-true"],
            ("precision='64-true')` is not supported", "must be one of", "fix that Trainer option"),
        ),
        "precision-unknown": ([*TINY, "--trainer.precision", "17"], ("`trainer.precision`", "17", "'bf16-mixed'")),
        "strategy-file-wrong-type": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy1.yaml", "  zero: {stage: three}\n")],
            (".yaml'", "`zero.stage`", "expected int, got three"),
        ),
        "strategy-file-wrong-value": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy2.yaml", "  zero: {offload_optimizer: disk}\n")],
            (".yaml'", "`zero.offload_optimizer`", "got disk", "'cpu'"),
        ),
        "strategy-file-zero-and-deepspeed-config": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy3.yaml", both)],
            ("either `zero` or `deepspeed_config`", "not both"),
        ),
        "strategy-file-unknown-key": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy4.yaml", "  bogus: 1\n")],
            (".yaml'", "'bogus' is not accepted"),
        ),
        "strategy-file-stage-4": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy7.yaml", "  zero: {stage: 4}\n")],
            ("ZeRO stage must be 0, 1, 2 or 3, got 4", "set `stage`"),
        ),
        "strategy-file-unknown-zero-key": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy8.yaml", "  zero: {stagee: 3}\n")],
            ("Option 'stagee' is not accepted",),
        ),
        "strategy-file-unknown-class": (
            [*TINY, "--trainer.strategy", write(tmp_path, "noclass.yaml", "class_path: no.such.Strategy\n")],
            ("No module named 'no'", "class_path"),
        ),
        "strategy-file-bad-yaml": (
            [*TINY, "--trainer.strategy", write(tmp_path, "strategy-yaml.yaml", "class_path: [unclosed\n")],
            ("not valid YAML", "line 1", "fix the syntax"),
        ),
        "deepspeed-config-missing": (
            [
                *TINY,
                "--trainer.strategy",
                ds(tmp_path, "strategy5.yaml", f"  deepspeed_config: {tmp_path / 'missing.json'}\n"),
            ],
            ("missing.json' does not exist", "existing JSON"),
        ),
        "deepspeed-config-bad-json": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy6.yaml", f"  deepspeed_config: {bad_json}\n")],
            ("not valid JSON", "fix the file"),
        ),
        "deepspeed-config-unknown-section": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy9.yaml", f"  deepspeed_config: {section_typo}\n")],
            ("ds-section.json': unknown section `zero_optimisation`", "did you mean `zero_optimization`?"),
        ),
        "deepspeed-config-unknown-key": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy10.yaml", f"  deepspeed_config: {key_typo}\n")],
            ("`zero_optimization.stage3_prefetch_bucket_sizee`", "did you mean `stage3_prefetch_bucket_size`?"),
        ),
        "deepspeed-config-contradicts-trainer": (
            [*TINY, "--trainer.strategy", ds(tmp_path, "strategy11.yaml", f"  deepspeed_config: {accumulation}\n")],
            ("`gradient_accumulation_steps: 4`", "`accumulate_grad_batches=1`", "make them agree"),
        ),
        "deepspeed-clip-by-value": (
            [*TINY, "--trainer.gradient_clip_val=1.0", "--trainer.gradient_clip_algorithm=value"],
            ("clips gradients only by norm", "`--trainer.gradient_clip_algorithm norm`"),
        ),
        "strategy-name-typo": (
            [*TINY, "--trainer.strategy", "zreo2"],
            ("error: Unknown strategy 'zreo2': did you mean 'zero2'?",),
        ),
        "lightning-deepspeed-on-cpu": (
            [*TINY, "--trainer.strategy", "deepspeed_stage_2"],
            ("only on CUDA GPUs", "--trainer.strategy zero2"),
        ),
        "lightning-fsdp-on-cpu": ([*TINY, "--trainer.strategy", "fsdp"], ("only on CUDA GPUs", "zero3_fsdp")),
        "config-missing": (["fit", "--config", str(tmp_path / "nope.yaml")], ("does not exist", "check the path")),
        "config-bad-yaml": (
            ["fit", "--config", write(tmp_path, "config-yaml.yaml", "trainer: [unclosed\n")],
            ("config file", "not valid YAML", "fix the syntax"),
        ),
        "config-unknown-section": (
            [*TINY, "--config", write(tmp_path, "config-section.yaml", "trainr: {max_steps: 1}\n")],
            ("'trainr.max_steps'", "--help"),
        ),
        "max-steps-word": ([*TINY, "--trainer.max_steps", "abc"], ("`trainer.max_steps`", "expected int, got abc")),
        "max-steps-negative": ([*TINY, "--trainer.max_steps", "-5"], ("`trainer.max_steps` is -5", "-1 for no limit")),
        "trainer-unknown-key": ([*TINY, "--trainer.bogus", "1"], ("--trainer.bogus", "check the spelling")),
        "model-unknown-key": (
            [*TINY, "--model.init_args.bogus=1"],
            ("error: bad value for `model`: Option 'bogus' is not accepted",),
        ),
        "model-unknown-class": ([*TINY, "--model.class_path", "no.such.Module"], ("`model`", "check the class_path")),
        "num-nodes-0": ([*TINY, "--trainer.num_nodes", "0"], ("`trainer.num_nodes` is 0", "1 or more")),
        "seed-word": ([*TINY, "--seed_everything", "abc"], ("`seed_everything`", "bool or int")),
        "accumulate-0": ([*TINY, "--trainer.accumulate_grad_batches", "0"], ("accumulate_grad_batches", "1 or more")),
        "limit-batches-negative": ([*TINY, "--trainer.limit_train_batches", "-1"], ("limit_train_batches", "fix")),
        "max-epochs-negative": ([*TINY, "--trainer.max_epochs", "-5"], ("max_epochs", "-1", "fix")),
        "val-check-interval-0": ([*TINY, "--trainer.val_check_interval", "0"], ("val_check_interval", "(0, 1]")),
        "clip-negative": ([*TINY, "--trainer.gradient_clip_val", "-1"], ("gradient_clip_val", "0 or more")),
        "clip-algorithm": ([*TINY, "--trainer.gradient_clip_algorithm", "foo"], ("foo", "'norm'")),
        "callback-unknown-class": ([*TINY, "--trainer.callbacks", "no.such.Callback"], ("`trainer.callbacks`",)),
        "subcommand-typo": (["fitt"], ("Unknown command 'fitt'", "did you mean 'fit'?")),
        "command-typo": (["consolidat", "x.ckpt"], ("'consolidat'", "did you mean 'consolidate'?", "build-ops")),
        "no-arguments": ([], ("No command given", "fit, validate", "build-ops", "--help")),
        "strategies-unknown-option": (["strategies", "--all"], ("--all", "lightning-zero strategies --help")),
        "build-ops-unknown-option": (["build-ops", "now"], ("unrecognized arguments: now", "build-ops --help")),
        "consolidate-no-checkpoint": (["consolidate"], ("required: checkpoint", "lightning-zero consolidate --help")),
        "consolidate-no-output": (["consolidate", "x.ckpt"], ("give OUT, --hf-dir, or both",)),
        "model-name-unknown": (
            [*QUICKSTART, "--model.init_args.model", "no-such-org/no-such-model"],
            ("'no-such-org/no-such-model'", "check the name"),
        ),
        "model-shape-unknown": (
            [*QUICKSTART, "--model.init_args.model=shape:nope", "--model.init_args.tokenizer=all-MiniLM-L6-v2"],
            ("'nope'", "choose one of"),
        ),
        "model-folder-missing": (
            [*QUICKSTART, "--model.init_args.model", str(tmp_path / "no" / "model")],
            ("does not exist", "saved model folder"),
        ),
        "tokenizer-name-unknown": (
            [*QUICKSTART, "--data.init_args.tokenizer", "no-such-org/no-such-tokenizer"],
            ("Tokenizer 'no-such-org/no-such-tokenizer'", "check the name"),
        ),
        "data-batch-size-0": ([*QUICKSTART, "--data.init_args.batch_size", "0"], ("batch_size (0)", ">= 1")),
        "data-val-fraction": (
            QUICKSTART + IN_PROCESS + ["--data.init_args.val_fraction=1.5"],
            ("val_fraction", "e.g. 0.1"),
        ),
        "data-limit-negative": (QUICKSTART + IN_PROCESS + ["--data.init_args.limit_train=-3"], ("-3", "null for all")),
        "data-file-missing": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={tmp_path / 'train.csv'}"],
            ("`data.train_file`", "train.csv' does not exist", "check the path"),
        ),
        "data-validation-file-missing": (
            QUICKSTART
            + FILES_DATA
            + [f"--data.init_args.train_file={labels}", "--data.init_args.validation_file=v.csv"],
            ("`data.validation_file` 'v.csv' does not exist",),
        ),
        "data-file-not-rows": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={rows}", *IN_PROCESS],
            ("not a list of objects", "reshape the JSON"),
        ),
        "data-file-no-such-column": (
            QUICKSTART
            + FILES_DATA
            + [f"--data.init_args.train_file={labels}", "--data.init_args.text_column=body", *IN_PROCESS],
            ("no column 'body'", "choose one of"),
        ),
        "data-file-latin1": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={latin1}"],
            ("latin1.csv' is not valid utf-8 at byte 17 (line 2)", "pass data.init_args.encoding: latin-1"),
        ),
        "data-file-not-ascii": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={latin1}", "--data.init_args.encoding=ascii"],
            ("latin1.csv' is not valid ascii at byte 17", "pass data.init_args.encoding"),
        ),
        "data-encoding-unknown": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={labels}", "--data.init_args.encoding=latin_one"],
            ("Unknown encoding 'latin_one'", "utf-8, latin-1 or cp1252"),
        ),
        "data-file-directory": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={tmp_path}"],
            ("`data.train_file`", "is a directory: name a data file in it"),
        ),
        "data-file-no-such-column-before-launch": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={labels}", "--data.init_args.label_column=y"],
            ("no column 'y'", "choose one of ['label', 'text']"),
        ),
        "chat-no-checkpoint": (["chat"], ("--checkpoint", "lightning-zero chat --help")),
        "chat-checkpoint-missing": (["chat", "--checkpoint", str(tmp_path / "x.ckpt")], ("does not exist", ".ckpt")),
        "chat-beams-word": (["chat", "--checkpoint", "x", "--num-beams", "x"], ("--num-beams", "invalid int")),
        "chat-beams-0": (["chat", "--checkpoint", "x", "--num-beams", "0"], ("--num-beams is 0", "1 or more")),
        "chat-max-turns-negative": (["chat", "--checkpoint", "x", "--max-turns", "-1"], ("--max-turns is -1",)),
        "chat-unknown-option": (["chat", "--checkpoint", "x", "--bogus"], ("--bogus", "--help")),
    }


with tempfile.TemporaryDirectory() as scratch:
    CASE_IDS = list(cases(Path(scratch)))


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_input_is_one_error_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, fragments = cases(tmp_path)[case]
    line = error_line(capsys, argv)
    for fragment in fragments:
        assert fragment in line, line


def test_there_are_at_least_40_cases() -> None:
    assert len(CASE_IDS) >= 40


REAL_PROCESS_CASES = ["fp16-deepspeed-cpu", "deepspeed-clip-by-value", "deepspeed-config-unknown-section"]
REAL_PROCESS_WRONG_KINDS = ["chat-classifier-checkpoint", "plan-empty-config", "fit-deepspeed-config"]
#: By case: the case as given (its argv first), and its run.
RealProcesses = dict[str, tuple[Any, subprocess.CompletedProcess[str]]]


def latin1_arguments(directory: Path) -> list[str]:
    """The quickstart on 2 processes, given a training file in Latin-1."""
    latin1 = directory / "latin1.csv"
    latin1.write_bytes("text,label\nun café,1\nmauvais,0\n".encode("latin-1"))
    return [*QUICKSTART, *FILES_DATA, f"--data.init_args.train_file={latin1}", "--trainer.devices=2"]


def run_main(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def real_processes(tmp_path_factory: pytest.TempPathFactory) -> RealProcesses:
    """Each real-process case (as :func:`cases` or :func:`wrong_kind_cases` gives it: its argv first) and its
    ``main.py`` run, two at a time (each is one process that mostly imports, so the two cores run two side by side)."""
    given: dict[str, Any] = {case: cases(tmp_path_factory.mktemp(case))[case] for case in REAL_PROCESS_CASES}
    given |= {case: wrong_kind_cases(tmp_path_factory.mktemp(case))[case] for case in REAL_PROCESS_WRONG_KINDS}
    given["latin-1"] = (latin1_arguments(tmp_path_factory.mktemp("latin-1")),)
    results = side_by_side(run_main, {case: case_given[0] for case, case_given in given.items()}, at_once=2)
    return {case: (given[case], results[case]) for case in given}


def the_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """A real process's one `error:` line, its last, after checking the exit status and that no traceback or
    warning came before it."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.strip().splitlines()[-1]], result.stderr[-2000:]
    return errors[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", REAL_PROCESS_CASES)
def test_a_real_process_ends_at_once_without_a_traceback(case: str, real_processes: RealProcesses) -> None:
    (_, fragments), result = real_processes[case]
    line = the_one_error_line(result)
    assert all(fragment in line for fragment in fragments), line


@pytest.mark.parametrize(
    ("trainer_args", "deepspeed_config", "fragment"),
    [
        ({"gradient_clip_val": 1.0, "gradient_clip_algorithm": "value"}, None, "clips gradients only by norm"),
        ({"precision": "16-mixed"}, None, "fp16, which DeepSpeed does not support on CPU"),
        ({"gradient_clip_val": 1.0}, {"gradient_clipping": 0.5}, "`gradient_clipping: 0.5` but the Trainer has"),
        ({}, {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}, "cannot be inferred"),
    ],
    ids=["clip-by-value", "fp16-on-cpu", "config-contradicts-trainer", "auto-nothing-fills"],
)
def test_a_trainer_built_in_python_is_checked_before_the_ranks_start(
    trainer_args: dict[str, object], deepspeed_config: dict[str, object] | None, fragment: str
) -> None:
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ZeroStrategy(deepspeed_config=deepspeed_config),
        **{"precision": "32-true", "logger": False, "enable_checkpointing": False, **trainer_args},  # type: ignore[arg-type]
    )
    with pytest.raises(ZeroConfigError) as caught:
        trainer.fit(BoringModel())
    assert fragment in str(caught.value)


@pytest.mark.multiprocess
def test_a_file_in_another_encoding_ends_a_two_process_run_at_once_without_a_traceback(
    real_processes: RealProcesses,
) -> None:
    line = the_one_error_line(real_processes["latin-1"][1])
    assert "not valid utf-8 at byte 17 (line 2): pass data.init_args.encoding: latin-1" in line


# --- inputs of the wrong kind: another kind of checkpoint, config or data file, or an empty one --------------------

CLASSIFIER = "lightning_zero.app.tasks.classification.SequenceClassificationTask"


def classifier_checkpoint(tmp_path: Path, saved_by_cli: bool) -> str:
    """A Lightning checkpoint of the classification task (its weights do not matter here), as the CLI saves it (with
    the task's class path, which a CLI given it as `--ckpt_path` builds instead of its config's model) or as a
    Python script does (hyper-parameters only)."""
    hparams: dict[str, object] = {"model": "shape:tiny-deberta-v2", "num_labels": 2, "learning_rate": 5e-5}
    if saved_by_cli:
        hparams["_class_path"] = CLASSIFIER
    path = tmp_path / f"classifier-{'cli' if saved_by_cli else 'python'}.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": hparams, "pytorch-lightning_version": "2.5.0"}, path)
    return str(path)


# (id, argv builder, what the line says is wrong, the fix the line ends with)
def wrong_kind_cases(tmp_path: Path) -> dict[str, tuple[list[str], str, str]]:
    classifier = classifier_checkpoint(tmp_path, saved_by_cli=True)
    data = write(tmp_path, "labels.csv", "text,label\nfine,1\n")
    empty = write(tmp_path, "empty.yaml", "# nothing yet\n")
    deepspeed = write(tmp_path, "ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}')
    plain_weights = tmp_path / "weights.pt"
    torch.save({"linear.weight": torch.zeros(2, 2)}, plain_weights)
    binary_data = tmp_path / "train.csv"
    binary_data.write_bytes(Path(classifier).read_bytes())
    run_config = "pass a run config with `trainer`, `model` and `data` sections, such as configs/quickstart.yaml."
    trainer_checkpoint = "pass a .ckpt file or directory that a Trainer saved, or 'last'."
    return {
        "chat-classifier-checkpoint": (
            ["chat", "--checkpoint", classifier],
            "is not a chatbot's (it holds a SequenceClassificationTask)",
            "e.g. of `lightning-zero fit --config configs/blenderbot_cpu.yaml`.",
        ),
        "chat-classifier-checkpoint-saved-in-python": (
            ["chat", "--checkpoint", classifier_checkpoint(tmp_path, saved_by_cli=False)],
            "is not a chatbot's (it holds a model with num_labels)",
            "e.g. of `lightning-zero fit --config configs/blenderbot_cpu.yaml`.",
        ),
        "chat-data-file": (["chat", "--checkpoint", data], "is not a torch checkpoint", trainer_checkpoint),
        "chat-empty-file": (
            ["chat", "--checkpoint", write(tmp_path, "empty.ckpt", "")],
            "is not a torch checkpoint (truncated",
            trainer_checkpoint,
        ),
        "consolidate-data-file": (
            ["consolidate", data, str(tmp_path / "out.safetensors")],
            "is not a torch checkpoint",
            trainer_checkpoint,
        ),
        "consolidate-plain-weights": (
            ["consolidate", str(plain_weights), str(tmp_path / "out.safetensors")],
            "is not a Lightning checkpoint (a mapping of 1 entries such as ['linear.weight'])",
            "load them into the model before `fit`.",
        ),
        "consolidate-a-folder": (
            ["consolidate", str(tmp_path), str(tmp_path / "out.safetensors")],
            "is a directory but not a checkpoint",
            trainer_checkpoint,
        ),
        "fit-empty-config": (["fit", "--config", empty], "empty.yaml' is empty", run_config),
        "plan-empty-config": (["plan", "--config", empty], "empty.yaml' is empty", run_config),
        "fit-deepspeed-config": (
            ["fit", "--config", deepspeed],
            "ds.json' is a DeepSpeed config, not a run config",
            "--trainer.strategy.init_args.deepspeed_config ds.json`.",
        ),
        "plan-deepspeed-config": (
            ["plan", f"--config={deepspeed}"],
            "ds.json' is a DeepSpeed config, not a run config",
            "--trainer.strategy.init_args.deepspeed_config ds.json`.",
        ),
        "fit-data-file-as-config": (["fit", "--config", data], "labels.csv' holds a str, not sections", run_config),
        "plan-checkpoint-as-config": (
            ["plan", "--config", classifier],
            "is not text (a checkpoint goes to --ckpt_path)",
            run_config,
        ),
        "fit-checkpoint-of-another-model": (
            [*TINY, "--ckpt_path", classifier_checkpoint(tmp_path, saved_by_cli=False)],
            "was saved with hyper-parameters that this model config does not take",
            "pass a checkpoint of this model.",
        ),
        "fit-data-file-that-is-a-checkpoint": (
            QUICKSTART + FILES_DATA + [f"--data.init_args.train_file={binary_data}"],
            "train.csv' is binary, not text (a checkpoint or an archive?)",
            "name a .csv text file of rows.",
        ),
    }


with tempfile.TemporaryDirectory() as scratch:
    WRONG_KIND_IDS = list(wrong_kind_cases(Path(scratch)))


@pytest.mark.parametrize("case", WRONG_KIND_IDS)
def test_an_input_of_the_wrong_kind_is_one_line_ending_in_its_fix(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, what, fix = wrong_kind_cases(tmp_path)[case]
    line = error_line(capsys, argv)
    assert what in line and line.endswith(fix), line


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", REAL_PROCESS_WRONG_KINDS)
def test_a_real_process_given_the_wrong_kind_of_file_ends_in_one_line(case: str, real_processes: RealProcesses) -> None:
    (_, what, fix), result = real_processes[case]
    line = the_one_error_line(result)
    assert what in line and line.endswith(fix), line


def test_no_error_message_of_the_package_leaves_too_little_room_for_its_values() -> None:
    """Every error message written in the package, its values left out, is short enough that with paths and names
    filled in the line stays within MAX_LINE (the runs above check whole lines)."""
    longest = 240
    too_long = [f"{where}: {len(text)}" for where, text in error_messages() if len(text) > longest]
    assert too_long == []


def error_messages() -> list[tuple[str, str]]:
    """(file:line, the message's fixed text) of every ZeroConfigError/ZeroDataError raised in the package."""
    found = []
    for path in sorted((REPO / "lightning_zero").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            called = getattr(name, "id", getattr(name, "attr", None))
            if isinstance(node, ast.Call) and called in ("ZeroConfigError", "ZeroDataError") and node.args:
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", fixed_text(node.args[0])))
    assert len(found) > 100  # the scan sees the package's messages
    return found


def fixed_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(fixed_text(value) for value in node.values if isinstance(value, ast.Constant))
    if isinstance(node, ast.BinOp):
        return fixed_text(node.left) + fixed_text(node.right)
    return ""


# --- quiet by default -----------------------------------------------------------------------------------------------

NOISE = "`torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single`."


def emit_noise(caplog: pytest.LogCaptureFixture, quiet: Callable[[], AbstractContextManager[None]]) -> list[str]:
    """Inside ``quiet()``, emit a collective deprecation warning, a warning a user needs and DeepSpeed's accelerator
    warning; return what got through (every warning is shown unless a filter drops it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet(), caplog.at_level(logging.WARNING, logger="DeepSpeed"):
            warnings.warn(NOISE, FutureWarning, stacklevel=1)
            warnings.warn("a warning a user should see", UserWarning, stacklevel=1)
            logging.getLogger("DeepSpeed").warning("Setting accelerator to CPU. ... we were unable to detect it.")
    return [str(warning.message) for warning in caught] + [record.getMessage() for record in caplog.records]


def test_library_noise_is_silenced(caplog: pytest.LogCaptureFixture) -> None:
    assert emit_noise(caplog, quiet_libraries) == ["a warning a user should see"]


def test_verbose_brings_the_noise_back(caplog: pytest.LogCaptureFixture) -> None:
    seen = emit_noise(caplog, lambda: quiet_libraries(verbose=True))
    assert NOISE in seen and any("unable to detect" in message for message in seen)


def test_quiet_ends_with_the_run(caplog: pytest.LogCaptureFixture) -> None:
    with quiet_libraries():
        pass
    assert NOISE in emit_noise(caplog, contextlib.nullcontext)


def test_verbose_is_not_passed_on_to_lightning(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies", "--verbose"]) == 0
    assert "zero2" in capsys.readouterr().out


def test_a_load_report_of_a_new_head_is_dropped_and_one_of_unexpected_weights_kept() -> None:
    logger = logging.getLogger("transformers.modeling_utils")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with quiet_libraries():
            logger.warning("BertForSequenceClassification LOAD REPORT from: x\nclassifier.bias | MISSING |")
            logger.warning("BertModel LOAD REPORT from: x\npooler.dense.bias | UNEXPECTED |")
    finally:
        logger.removeHandler(handler)
    assert seen == ["BertModel LOAD REPORT from: x\npooler.dense.bias | UNEXPECTED |"]
