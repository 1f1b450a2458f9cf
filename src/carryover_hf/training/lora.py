"""LoRA on the drafter through PEFT, e.g. to adapt an imported DFlash drafter to carryover drafting.

The carryover objective also trains `E_carry`, a bare parameter that a LoRA adapter cannot hold. With LoRA it is
trained in full and saved next to the adapter as `carryover_extra.safetensors`; `load_lora_drafter` restores it, and
a merged model holds it like any other weight.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file

from ..modeling_carryover import CarryoverDrafterModel

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXTRA_WEIGHTS_NAME = "carryover_extra.safetensors"


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def apply_lora(
    drafter: CarryoverDrafterModel,
    r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    target_modules: list[str] | None = None,
    modules_to_save: list[str] | None = None,
):
    """Wraps `drafter` in a `PeftModel` with LoRA on its projections (attention and MLP by default; add `"fc"` to
    adapt the context fusion too). `modules_to_save` are trained in full (e.g. `["markov_head"]`)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=list(target_modules or DEFAULT_LORA_TARGETS),
        modules_to_save=modules_to_save,
        bias="none",
    )
    return get_peft_model(drafter, config)


def base_drafter(model) -> CarryoverDrafterModel:
    """The `CarryoverDrafterModel` inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if is_peft_model(model) else model


def extra_trainable_state(model) -> dict[str, torch.Tensor]:
    """Trainable weights of a PEFT-wrapped drafter that its adapter does not save (`E_carry`)."""
    if not is_peft_model(model):
        return {}
    drafter = base_drafter(model)
    return {"carry_embedding": drafter.carry_embedding.detach().cpu()} if drafter.carry_embedding.requires_grad else {}


def save_extra_trainable_state(model, output_dir: str) -> None:
    state = extra_trainable_state(model)
    if state:
        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(output_dir, EXTRA_WEIGHTS_NAME))


def load_extra_trainable_state(model, directory: str) -> bool:
    """Restores `E_carry` saved next to an adapter; returns whether a file was found."""
    path = os.path.join(directory, EXTRA_WEIGHTS_NAME)
    if not os.path.isfile(path):
        return False
    drafter = base_drafter(model)
    state = load_file(path)
    unknown = set(state) - {"carry_embedding"}
    if unknown:
        raise ValueError(f"{path} holds unexpected tensors {sorted(unknown)}.")
    with torch.no_grad():
        drafter.carry_embedding.copy_(state["carry_embedding"].to(drafter.carry_embedding))
    return True


def load_lora_drafter(base, adapter_dir: str, is_trainable: bool = False):
    """A drafter plus a saved adapter (and its `E_carry`, if trained with carryover) as a `PeftModel`.

    `base` is a `CarryoverDrafterModel` or a path for `CarryoverDrafterModel.from_pretrained`.
    """
    from peft import PeftModel

    if isinstance(base, (str, os.PathLike)):
        base = CarryoverDrafterModel.from_pretrained(base)
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=is_trainable)
    if load_extra_trainable_state(model, adapter_dir):
        base_drafter(model).config.trained_with_carryover = True
    return model


def merge_lora(model) -> CarryoverDrafterModel:
    """Folds the adapter into the drafter's weights: a plain `CarryoverDrafterModel` to save and share."""
    return model.merge_and_unload() if is_peft_model(model) else model


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "EXTRA_WEIGHTS_NAME",
    "apply_lora",
    "base_drafter",
    "is_peft_model",
    "load_lora_drafter",
    "merge_lora",
]
