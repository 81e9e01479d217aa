"""The one-card campaign: Llama-3.2-3B or Llama-3.1-8B's shape (random init, 2048-token samples, global batch 16) in a
user's own LightningModule, our one-card levers against Accelerate's DeepSpeed offload, one process per row, each
capped at 24 GiB of GPU memory; each row appended to a JSONL as it finishes (a cut call keeps its rows).

    python benchmarks/onecard_llama.py --model llama-3.2-3b --rows ROW,ROW --out rows.jsonl --steps 20
    python benchmarks/onecard_llama.py --out rows.jsonl --plot rows.png     # a bar of tokens/s for each row

Rows (``ROWS``): ``onecard_*`` are our presets through Lightning with our chunked loss (``causal_lm_nll``);
``accelerate_*`` are Accelerate's ``DeepSpeedPlugin`` (stage, offload devices, nothing else) with Hugging Face
gradient checkpointing, its plain loop, the model's own loss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

GIB = 2**30
SEQ = 2048
GLOBAL_BATCH = 16
CAP_GIB = 24.0
#: The campaign's device; CPU only for a smoke run of a tiny shape (``--model tiny-llama``).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

#: label -> how the row runs: preset and overrides, Trainer precision, micro-batch (the rest is accumulation). The
#: step in backward and CPUOffloadOptimizer's freed gradients allow no accumulation, so ours run at 16 x 1.
ROWS: dict[str, dict[str, Any]] = {
    "onecard_adamw8bit+ac+offload_act@16": {
        "preset": "onecard_adamw8bit",
        "zero": {"activation_checkpointing": True, "activation_offload": True},
        "precision": "bf16-true",
        "micro": 16,
    },
    "onecard_offload+ac+offload_act@16": {
        "preset": "onecard_offload",
        "zero": {"activation_checkpointing": True, "activation_offload": True},
        "precision": "bf16-mixed",
        "micro": 16,
    },
    "onecard_offload_bf16+ac+offload_act@16": {
        "preset": "onecard_offload",
        "zero": {"activation_checkpointing": True, "activation_offload": True},
        "precision": "bf16-true",
        "micro": 16,
    },
    "accelerate_ds2_offload+hf_gc@4x4": {"accelerate": 2, "precision": "bf16-mixed", "micro": 4},
    "accelerate_ds2_offload+hf_gc@8x2": {"accelerate": 2, "precision": "bf16-mixed", "micro": 8},
    "accelerate_ds2_offload+hf_gc@2x8": {"accelerate": 2, "precision": "bf16-mixed", "micro": 2},
    "accelerate_ds3_offload+hf_gc@4x4": {"accelerate": 3, "precision": "bf16-mixed", "micro": 4},
    "accelerate_ds3_offload+hf_gc@8x2": {"accelerate": 3, "precision": "bf16-mixed", "micro": 8},
    "accelerate_ds3_offload+hf_gc@2x8": {"accelerate": 3, "precision": "bf16-mixed", "micro": 2},
    "lightning_ds2_offload+hf_gc@4x4": {"lightning": 2, "precision": "bf16-mixed", "micro": 4},
    "lightning_ds2_offload+hf_gc@2x8": {"lightning": 2, "precision": "bf16-mixed", "micro": 2},
    "lightning_ds3_offload+hf_gc@4x4": {"lightning": 3, "precision": "bf16-mixed", "micro": 4},
    "lightning_ds3_offload+hf_gc@2x8": {"lightning": 3, "precision": "bf16-mixed", "micro": 2},
    "task_onecard_adamw8bit+ac+offload_act@16": {
        "preset": "onecard_adamw8bit",
        "zero": {"activation_checkpointing": True, "activation_offload": True},
        "precision": "bf16-true",
        "micro": 16,
        "task": True,
    },
    "task_onecard_offload+ac+offload_act@16": {
        "preset": "onecard_offload",
        "zero": {"activation_checkpointing": True, "activation_offload": True},
        "precision": "bf16-mixed",
        "micro": 16,
        "task": True,
    },
    "zero_auto@16": {"preset": "zero_auto", "zero": {"max_trials": 2}, "precision": "bf16-mixed", "micro": 16},
    "zero_auto_approximate_bf16@16": {
        "preset": "zero_auto",
        "zero": {"max_trials": 2, "approximate": True},
        "precision": "bf16-true",
        "micro": 16,
    },
}


def build_model(shape: str, dtype: torch.dtype, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    from lightning_zero.app.models.shapes import shape_config

    config = shape_config(shape)
    config.use_cache = False
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def parameter_count(shape: str) -> int:
    return sum(p.numel() for p in build_model(shape, torch.float32, "meta").parameters())


def samples(vocab: int, count: int, micro: int) -> Any:
    """A loader of ``count`` random 2048-token samples in micro-batches of ``micro``."""
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(torch.randint(0, vocab, (count, SEQ), generator=generator), batch_size=micro)


class Timer:
    """Seconds of each optimizer step (after a CUDA synchronize), the first ``warmup`` left out."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.marks: list[float] = []

    def mark(self) -> None:
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())
        if len(self.marks) == self.warmup + 1 and DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def result(self, parameters: int) -> dict[str, Any]:
        from benchmarks.bench.report import DEFAULT_PEAK_TFLOPS  # the harness's MFU denominator (benchmarks/README.md)

        timed = self.marks[self.warmup :]
        steps = len(timed) - 1
        seconds = (timed[-1] - timed[0]) / steps
        tokens = GLOBAL_BATCH * SEQ / seconds
        return {
            "timed_steps": steps,
            "step_s": round(seconds, 3),
            "samples_per_s": round(GLOBAL_BATCH / seconds, 3),
            "tokens_per_s": round(tokens),
            "mfu": round(6 * parameters * tokens / (DEFAULT_PEAK_TFLOPS * 1e12), 4),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if DEVICE == "cuda" else None,
        }


def _user_module(model: Any, by_hand: bool, ids: torch.Tensor, micro: int) -> Any:
    """A user's own LightningModule around ``model``: our chunked loss and a torch AdamW, or (``by_hand``, for
    Lightning's DeepSpeed offload by hand) the model's own loss and DeepSpeed's CPU Adam, which DeepSpeed requires
    there; its loader of ``ids`` reads ``batch_size`` (``zero_auto`` sets it to the micro-batch it chose)."""
    import lightning.pytorch as pl

    from lightning_zero.app.tasks.losses import causal_lm_nll

    class UserModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.batch_size = micro

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(ids, batch_size=self.batch_size)

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            if by_hand:
                return self.model(input_ids=batch, labels=batch).loss
            nll, count = causal_lm_nll(self.model, batch, None, batch, SEQ)
            return nll / count

        def configure_optimizers(self) -> Any:
            if by_hand:
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                return DeepSpeedCPUAdam(self.parameters(), lr=1e-5, weight_decay=0.0, adamw_mode=True)
            return torch.optim.AdamW(self.parameters(), lr=1e-5, weight_decay=0.0)

    return UserModule()


def _task_module(shape: str) -> Any:
    """Our ``CausalLMTask`` with the shape, the model's vocabulary, the chunked loss."""
    from lightning_zero.app.tasks.causal_lm import CausalLMTask

    vocab = vocab_size_of(shape)
    return CausalLMTask(model=f"shape:{shape}", vocab_size=vocab, loss_chunk_tokens=SEQ, learning_rate=1e-5)


def vocab_size_of(shape: str) -> int:
    from lightning_zero.app.models.shapes import shape_config

    return int(shape_config(shape).vocab_size)


def _strategy(row: dict[str, Any]) -> Any:
    """Our preset with the row's fields, or Lightning's own DeepSpeed strategy by hand (stage, offload devices)."""
    if "lightning" in row:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        stage = row["lightning"]
        return DeepSpeedStrategy(stage=stage, offload_optimizer=True, offload_parameters=stage == 3)
    from lightning_zero.presets import build_preset

    return build_preset(row["preset"], memory_budget_gib=CAP_GIB, **row["zero"])


class _TaskBatches(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def run_lightning(shape: str, row: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    import lightning.pytorch as pl

    timer = Timer(warmup)
    started = time.perf_counter()
    micro = row["micro"]
    parameters = parameter_count(shape)
    ids = samples(vocab_size_of(shape), (warmup + steps + 1) * GLOBAL_BATCH, micro).dataset
    loader: Any = None
    if row.get("task"):
        module = _task_module(shape)
        loader = torch.utils.data.DataLoader(_TaskBatches(ids), batch_size=micro)
    else:
        dtype = torch.bfloat16 if row["precision"] == "bf16-true" else torch.float32
        # Lightning's DeepSpeed by hand: the model on the host, as a user would build it for an offload run.
        model = build_model(shape, dtype, "cpu" if "lightning" in row else DEVICE)
        if "lightning" in row:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        module = _user_module(model, "lightning" in row, ids, micro)

    class StepTimes(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, index: int) -> None:
            if (index + 1) % int(trainer.accumulate_grad_batches) == 0:  # the micro-batch that ended a step
                timer.mark()

    strategy = _strategy(row)
    trainer = pl.Trainer(
        accelerator=DEVICE,
        devices=1,
        strategy=strategy,
        precision=row["precision"],
        max_steps=warmup + steps + 1,
        accumulate_grad_batches=GLOBAL_BATCH // micro,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepTimes()],
    )
    trainer.fit(module, loader)
    record = {**timer.result(parameters), "setup_and_run_s": round(time.perf_counter() - started, 1)}
    chosen = getattr(strategy, "chosen", None)
    if chosen is not None:
        trial = next((m for m in strategy.trials if m.candidate == chosen and m.fits), None)
        record["chosen"] = chosen.name
        record["trial_samples_per_s"] = round(trial.samples_per_sec, 3) if trial else None
        record["trials"] = [[m.candidate.name, m.fits, round(m.samples_per_sec, 3), m.reason] for m in strategy.trials]
    return record


def run_accelerate(shape: str, row: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    from accelerate import Accelerator, DeepSpeedPlugin

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", "29533")
    accumulate = GLOBAL_BATCH // row["micro"]
    stage = row["accelerate"]
    plugin = DeepSpeedPlugin(
        zero_stage=stage,
        offload_optimizer_device="cpu",
        offload_param_device="cpu" if stage == 3 else "none",
        gradient_accumulation_steps=accumulate,
    )
    parameters = parameter_count(shape)  # before Accelerate's ZeRO-3 makes transformers build models partitioned
    started = time.perf_counter()
    accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=plugin)
    model = build_model(shape, torch.float32, "cpu")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    loader = samples(model.config.vocab_size, (warmup + steps + 1) * GLOBAL_BATCH, row["micro"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    timer = Timer(warmup)
    for index, ids in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if (index + 1) % accumulate == 0:
            timer.mark()
    return {**timer.result(parameters), "setup_and_run_s": round(time.perf_counter() - started, 1)}


def run_row(shape: str, label: str, steps: int, warmup: int) -> None:
    """One row in this process: print its record as the last line."""
    if DEVICE == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(CAP_GIB * GIB / total, 0)
    row = ROWS[label]
    runner = run_accelerate if "accelerate" in row else run_lightning
    record = runner(shape, row, steps, warmup)
    print("ROW " + json.dumps({"model": shape, "row": label, **row, **record}), flush=True)


def _sample_host(stop: threading.Event, peak: list[float]) -> None:
    base = psutil.virtual_memory().used
    while not stop.wait(1.0):
        peak[0] = max(peak[0], (psutil.virtual_memory().used - base) / GIB)


def _log_path(out: str, label: str) -> Path:
    """Where a row's whole output goes, beside the JSONL (a plain file name: the device copies those back)."""
    return Path(out).with_name(f"{Path(out).stem}-{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.log")


def campaign(shape: str, labels: list[str], out: str, steps: int, warmup: int, timeout: int) -> None:
    """Each row in its own process, its record (or its failure) appended to ``out`` as it finishes."""
    for label in labels:
        stop, peak = threading.Event(), [0.0]
        sampler = threading.Thread(target=_sample_host, args=(stop, peak), daemon=True)
        sampler.start()
        command = [sys.executable, __file__, "--model", shape, "--one", label, "--steps", str(steps)]
        command += ["--warmup", str(warmup), "--seq", str(SEQ)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            _log_path(out, label).write_text(done.stdout + done.stderr)
            lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
            if lines:
                record = json.loads(lines[-1][4:])
            else:
                tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
                record = {"model": shape, "row": label, "error": " | ".join(tail)[-1500:]}
        except subprocess.TimeoutExpired as expired:
            output = (expired.stdout or b"") + (expired.stderr or b"")
            text = output.decode(errors="replace") if isinstance(output, bytes) else output
            _log_path(out, label).write_text(text)
            record = {"model": shape, "row": label, "error": f"timed out after {timeout} s"}
        stop.set()
        sampler.join()
        record.update(host_peak_gib=round(peak[0], 1), wall_s=round(time.perf_counter() - started, 1))
        card = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU smoke run"
        record["gpu"] = f"{card}, each process capped at {CAP_GIB:g} GiB"
        with open(out, "a") as file:
            file.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def plot(jsonl: Path, out: Path) -> None:
    """A bar of tokens/s for each row of ``jsonl`` that ran (its latest run), the rows that did not run named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.bench.report import DEFAULT_PEAK_TFLOPS

    latest = {record["row"]: record for record in map(json.loads, jsonl.read_text().splitlines())}
    ran = sorted((r for r in latest.values() if r.get("tokens_per_s")), key=lambda r: r["tokens_per_s"])
    parameters = parameter_count(ran[0]["model"])  # on a meta-device copy: an Accelerate row's own count was 0
    figure, axes = plt.subplots(figsize=(9, 0.45 * len(ran) + 1.4))
    axes.barh([r["row"] for r in ran], [r["tokens_per_s"] for r in ran], color="tab:blue")
    for index, record in enumerate(ran):
        mfu = 6 * parameters * record["tokens_per_s"] / (DEFAULT_PEAK_TFLOPS * 1e12)
        axes.text(record["tokens_per_s"], index, f" {record['tokens_per_s']:,}  ({mfu:.0%} MFU)", va="center")
    failed = sorted(row for row, record in latest.items() if not record.get("tokens_per_s"))
    axes.set_xlabel("tokens/s (higher is better)")
    axes.set_title(
        f"{ran[0]['model']}, {SEQ} tokens a sample, global batch {GLOBAL_BATCH}\n{ran[0]['gpu']}", fontsize=9
    )
    if failed:
        figure.text(0.01, 0.01, "no result: " + ", ".join(failed), fontsize=6, wrap=True)
    axes.set_xlim(0, max(r["tokens_per_s"] for r in ran) * 1.35)
    figure.tight_layout(rect=(0, 0.04 if failed else 0, 1, 1))
    figure.savefig(out, dpi=120)


def main() -> None:
    global SEQ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--one", default=None, help="run this one row in this process")
    parser.add_argument("--out", default="onecard.jsonl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds a row may take")
    parser.add_argument("--seq", type=int, default=SEQ, help="tokens a sample (shorter only for a smoke run)")
    parser.add_argument("--plot", default=None, help="plot the JSONL of --out to this PNG instead of running rows")
    args = parser.parse_args()
    SEQ = args.seq
    if args.plot:
        plot(Path(args.out), Path(args.plot))
    elif args.one:
        run_row(args.model, args.one, args.steps, args.warmup)
    else:
        campaign(args.model, args.rows.split(","), args.out, args.steps, args.warmup, args.timeout)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
