"""Find a model's repeated transformer blocks, checkpoint their activations and compile them, without model code
changes.

Sharding (one FSDP unit per block), activation checkpointing (recompute one block at a time) and compilation
(one ``torch.compile`` region per block) need to know what a "block" is. Hugging Face models name their block
classes in ``_no_split_modules``; any other model's blocks are taken to be the modules held in an
``nn.ModuleList`` that repeats one class.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_zero.internals import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
    no_split_module_names,
)


def _hugging_face_block_names(model: nn.Module) -> set[str]:
    names: set[str] = set()
    for module in model.modules():
        names.update(no_split_module_names(module))
    return names


def _repeated_module_list_classes(model: nn.Module) -> set[type[nn.Module]]:
    classes: set[type[nn.Module]] = set()
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                classes |= kinds
    return classes


def transformer_block_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of ``model``'s repeated blocks (empty when it has none)."""
    names = _hugging_face_block_names(model)
    if names:
        found = {type(module) for module in model.modules() if type(module).__name__ in names}
        if found:
            return found
    return _repeated_module_list_classes(model)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """``model``'s block instances, outermost first, none nested in another."""
    classes = tuple(transformer_block_classes(model))
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if classes and isinstance(module, classes):
            blocks.append(module)
            inside.update(id(child) for child in module.modules())
    return blocks


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each block's activations in backward. Returns how many blocks are checkpointed.

    Hugging Face models use their own ``gradient_checkpointing_enable`` (state-dict keys unchanged); other
    models get torch's non-reentrant checkpoint wrapper around each block.
    """
    hugging_face: list[Any] = [
        module
        for module in model.modules()
        if getattr(module, "supports_gradient_checkpointing", False)
        and hasattr(module, "gradient_checkpointing_enable")
    ]
    if hugging_face:
        for module in hugging_face[:1]:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return len(transformer_blocks(model))
    classes = tuple(transformer_block_classes(model))
    if not classes:
        return 0
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda module: checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda module: isinstance(module, classes),
    )
    return sum(isinstance(module, classes) for module in model.modules())


def compile_blocks(model: nn.Module) -> int:
    """Compile each block with ``torch.compile``, in place (state-dict keys unchanged). Returns how many.

    Checkpointed blocks stay checkpointed: the checkpoint is taken around the compiled block, whose recomputation
    runs the compiled code again. Compilation happens at the first forward pass of each new shape.
    """
    blocks = transformer_blocks(model)
    for block in blocks:
        block.compile()
    return len(blocks)


def prepare_blocks(model: nn.Module, checkpointing: bool, compiling: bool) -> None:
    """Checkpoint, then compile, ``model``'s blocks as a config's ``activation_checkpointing`` and
    ``compile_blocks`` ask, before a backend wraps or shards them; says on rank zero how many blocks each took."""
    if checkpointing:
        rank_zero_info(f"Activation checkpointing on {enable_activation_checkpointing(model)} transformer blocks.")
    if compiling:
        rank_zero_info(f"torch.compile on {compile_blocks(model)} transformer blocks.")
