"""What a user takes away from a run: ``consolidate --hf-dir`` gives a folder that ``transformers.pipeline`` uses as
it is, without lightning-zero: the run's tokenizer, the data's class names, and (models that generate) the
generation settings.

The classifier is the quickstart's recipe at a tiny size (helpers/export_run.py: DeepSpeed ZeRO-2, the MiniLM
tokenizer from the data module, the shipped movie reviews), 40 steps on 320 snippets: start-up and seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_zero.app.cli import main
from lightning_zero.app.data.text_files import TextClassificationFilesDataModule
from lightning_zero.app.hf_export import write_hf_dir
from lightning_zero.app.tasks.causal_lm import CausalLMTask
from lightning_zero.app.tasks.classification import SequenceClassificationTask
from lightning_zero.app.tasks.seq2seq import Seq2SeqTask
from lightning_zero.checkpoint.hf import hf_record
from tests.helpers.launch import run_script

RUNNER = Path(__file__).parent / "helpers" / "export_run.py"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES = [
    "A gorgeous, witty, seductive movie.",
    "The plot is a mess and the jokes fall flat.",
    "It's the best film of the year, and I'm not exaggerating.",
    "Boring, overlong and badly acted.",
    "An unexpectedly moving portrait of a small café in Paris.",
    "I wanted to leave after twenty minutes.",
]
#: Probabilities of the pipeline (a fresh interpreter, one sentence per forward) against the trained module's (the
#: training process, after DeepSpeed): the same fp32 operations on the same machine, but in other processes with
#: other kernels chosen (an AMX CPU differed by 2.2e-6 in logits across processes), and a softmax moves at most a
#: quarter of a logit change. 1e-5 leaves room for that. The module's probabilities for these sentences must spread
#: over more than 100 times that (measured: 9e-3), so a pipeline that gives every sentence one score (a wrong
#: tokenizer), or other weights or swapped label names, is off by far more than the tolerance.
PROBABILITY_TOLERANCE = 1e-5

PIPELINE = """
import json, sys
import transformers
classify = transformers.pipeline("text-classification", model=sys.argv[1], device="cpu")
results = classify(json.loads(sys.argv[2]), top_k=None)
print(json.dumps([{entry["label"]: entry["score"] for entry in result} for result in results]))
assert not [name for name in sys.modules if name.startswith("lightning_zero")]
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    run_script(RUNNER, str(out), json.dumps(SENTENCES), timeout=300)
    return out


@pytest.mark.multiprocess
def test_pipeline_on_the_export_gives_the_trained_modules_labels_and_scores(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "export"
    assert main(["consolidate", str(trained / "last.ckpt"), "--hf-dir", str(export)]) == 0
    assert {"tokenizer.json", "tokenizer_config.json"} <= {path.name for path in export.iterdir()}
    result = subprocess.run(
        [sys.executable, "-c", PIPELINE, str(export), json.dumps(SENTENCES)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    exported = json.loads(result.stdout.strip().splitlines()[-1])
    expected = json.loads((trained / "predictions.json").read_text())
    fresh = [scores["fresh"] for scores in expected]
    assert max(fresh) - min(fresh) > 100 * PROBABILITY_TOLERANCE, f"the module barely tells them apart: {fresh}"
    for sentence, got, want in zip(SENTENCES, exported, expected, strict=True):
        assert set(got) == {"rotten", "fresh"}, (sentence, got)
        assert max(got, key=got.__getitem__) == max(want, key=want.__getitem__), (sentence, got, want)
        for name, probability in want.items():
            assert got[name] == pytest.approx(probability, abs=PROBABILITY_TOLERANCE), (sentence, got, want)


@pytest.mark.parametrize(
    "task",
    [
        pytest.param(lambda: Seq2SeqTask(model="shape:tiny-t5", tokenizer=MINILM, num_beams=3), id="seq2seq"),
        pytest.param(lambda: CausalLMTask(model="shape:tiny-gpt2", tokenizer=MINILM), id="causal-lm"),
    ],
)
def test_export_of_a_generating_model_keeps_its_generation_config(task: object, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    module = task()  # type: ignore[operator]
    module.configure_model()
    module.model.generation_config.repetition_penalty = 1.3  # a setting the model config does not hold
    record = hf_record(module)
    assert record is not None
    write_hf_dir(record, module.state_dict(), tmp_path, torch.float32)
    written = GenerationConfig.from_pretrained(tmp_path)
    assert written.repetition_penalty == 1.3
    assert written.eos_token_id == module.model.config.eos_token_id
    assert AutoTokenizer.from_pretrained(tmp_path)("hello")["input_ids"] == module.tokenizer("hello")["input_ids"]


def test_seq2seq_export_generates_as_validation_does(tmp_path: Path) -> None:
    from transformers import GenerationConfig

    module = Seq2SeqTask(model="shape:tiny-t5", tokenizer=MINILM, num_beams=3, max_target_length=24)
    module.configure_model()
    record = hf_record(module)
    assert record is not None
    write_hf_dir(record, module.state_dict(), tmp_path, torch.float32)
    written = GenerationConfig.from_pretrained(tmp_path)
    assert (written.num_beams, written.max_new_tokens, written.decoder_start_token_id) == (3, 24, 101)


def test_the_datas_class_names_become_the_models_labels(tmp_path: Path) -> None:
    path = tmp_path / "three.csv"
    path.write_text("text,label\ngreat,positive\nawful,negative\nfine,neutral\nsuperb,positive\n")
    data = TextClassificationFilesDataModule(str(path), tokenizer=MINILM, val_fraction=0.25)
    data.setup()
    task = SequenceClassificationTask(model="shape:tiny-deberta-v2", num_labels=4)
    task._trainer = SimpleNamespace(datamodule=data)  # type: ignore[assignment]
    task.setup("fit")
    task.configure_model()
    config: Any = task.model.config  # type: ignore[union-attr]
    assert config.id2label == {0: "negative", 1: "neutral", 2: "positive", 3: "LABEL_3"}  # a 4th class, unnamed
    assert config.label2id == {"negative": 0, "neutral": 1, "positive": 2, "LABEL_3": 3}
    task.set_label_names(["bad", "so-so", "good", "great"])  # a model built already takes them at once
    assert config.id2label == {0: "bad", 1: "so-so", 2: "good", 3: "great"}
    record = hf_record(task)
    assert record is not None and json.loads(record["config"])["id2label"]["3"] == "great"
