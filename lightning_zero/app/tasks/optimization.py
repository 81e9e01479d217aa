"""The one optimizer and learning-rate schedule of every task: AdamW without decay on biases and norms, and a
linear warm-up then linear decay to 0 per optimizer step (``transformers.get_linear_schedule_with_warmup``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import nn
from transformers import get_linear_schedule_with_warmup
from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
from transformers.trainer_pt_utils import get_parameter_names

from lightning_zero.errors import ZeroConfigError

#: Parameter-name patterns without weight decay (those of Hugging Face's Trainer), besides norm layers' weights.
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters that get weight decay: all but biases and normalisation weights."""
    return set(get_parameter_names(model, ALL_LAYERNORM_LAYERS, NO_DECAY_PATTERNS))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups of the trainable parameters: with ``weight_decay``, and biases/norm weights without."""
    decayed = decay_parameter_names(model)
    decay = [p for name, p in model.named_parameters() if p.requires_grad and name in decayed]
    no_decay = [p for name, p in model.named_parameters() if p.requires_grad and name not in decayed]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def training_steps(module: LightningModule) -> int:
    """The Trainer's number of optimizer steps for this fit, or a one-line error when it cannot be known."""
    try:
        steps = module.trainer.estimated_stepping_batches
    except RuntimeError:  # no Trainer attached
        steps = math.inf
    if not math.isfinite(steps) or steps < 1:
        raise ZeroConfigError("The number of training steps is unknown: set trainer.max_steps or max_epochs.")
    return int(steps)


def adamw_with_linear_warmup(
    model: nn.Module,
    total_steps: int,
    learning_rate: float,
    weight_decay: float = 0.0,
    warmup_ratio: float = 0.0,
    eps: float = 1e-8,
) -> OptimizerLRSchedulerConfig:
    """A plain ``torch.optim.AdamW`` (which ZeRO offload turns into DeepSpeed's CPU Adam) and its schedule:
    ``int(total_steps * warmup_ratio)`` warm-up steps, then linear decay to 0 at ``total_steps``."""
    if not 0.0 <= warmup_ratio < 1.0:
        raise ZeroConfigError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}: use e.g. 0.1.")
    groups = parameter_groups(model, weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=learning_rate, weight_decay=weight_decay, eps=eps)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total_steps * warmup_ratio), total_steps)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
