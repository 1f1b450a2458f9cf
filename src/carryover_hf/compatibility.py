"""Checks that a drafter fits a target, run before any expensive work."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .configuration_carryover import CarryoverDrafterConfig


class DrafterTargetMismatchError(ValueError):
    """The drafter was made for another target."""


SUPPORTED_TRANSFORMERS = ((5, 17), (5, 26))  # [lowest, first unsupported) major.minor; CI tests both ends


def _transformers_at_least(major: int, minor: int) -> bool:
    import transformers
    from packaging.version import Version

    installed = Version(transformers.__version__)
    return (installed.major, installed.minor) >= (major, minor)


# A list `output_hidden_states=[...]` selects entries of the classic hidden-states tuple on Transformers 5.23+ (0 = the
# embeddings, i + 1 = decoder layer i) and decoder-layer ids on 5.17-5.22 (i = layer i, no embeddings entry). Both put
# the final-norm output in the last layer's slot. `features.hidden_state_indices` is the one place that reads this.
HIDDEN_STATES_LIST_COUNTS_EMBEDDINGS = _transformers_at_least(5, 23)
# Transformers 5.18+ crops accepted drafts at the first end-of-sequence token in its assisted loop. 5.17 keeps the
# drafts after one, so there the candidate generator ends its proposals at one itself (lossless either way); and 5.17
# stops at once when the prompt itself ends with one (the candidate generator refuses such a prompt there).
ASSISTED_LOOP_CROPS_AT_EOS = _transformers_at_least(5, 18)
# Transformers 5.24 renamed the models' cache argument `past_key_values` to `cache` (the old name warns, and goes in
# 5.40): calls of a target's forward pass their cache under this name.
CACHE_ARGUMENT = "cache" if _transformers_at_least(5, 24) else "past_key_values"
ALLOW_UNSUPPORTED_ENV = "CARRYOVER_HF_ALLOW_UNSUPPORTED_TRANSFORMERS"
# The private GenerationMixin methods the generate hook wraps, with the parameters it reads.
HOOKED_METHODS = {
    "_get_candidate_generator": ("generation_config", "input_ids", "logits_processor", "model_kwargs", "assistant_model"),
    "_validate_generation_mode": ("generation_config", "generation_mode_kwargs"),
}


def check_transformers_version(version: str | None = None) -> None:
    """Raises `ImportError` with what to install when the installed Transformers is not one this package supports.

    The generate hook wraps private `GenerationMixin` methods (see docs/generate.md), so only tested minor versions
    are accepted. `CARRYOVER_HF_ALLOW_UNSUPPORTED_TRANSFORMERS=1` turns the version check into a warning (the
    methods the hook needs must still exist with the parameters it reads).
    """
    import os
    import warnings

    import transformers
    from packaging.version import Version
    from transformers.generation.utils import GenerationMixin

    installed = Version(version or transformers.__version__)
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TRANSFORMERS
    supported = f">={low_major}.{low_minor},<{high_major}.{high_minor}"
    if not (low_major, low_minor) <= (installed.major, installed.minor) < (high_major, high_minor):
        message = (
            f"carryover-hf supports Transformers {supported}, but {installed} is installed. Its generate hook wraps "
            "private GenerationMixin methods that change between Transformers releases. Install a supported "
            f"version: pip install 'transformers{supported}'."
        )
        if os.environ.get(ALLOW_UNSUPPORTED_ENV) != "1":
            raise ImportError(message + f" (Set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway.)")
        warnings.warn(message, stacklevel=2)
    import inspect

    for name, parameters in HOOKED_METHODS.items():
        method = getattr(GenerationMixin, name, None)
        found = set(inspect.signature(method).parameters) if method is not None else set()
        missing = [p for p in parameters if p not in found]
        if method is None or missing:
            raise ImportError(
                f"Transformers {installed} has no GenerationMixin.{name}"
                + (f" with parameters {missing}" if method is not None else "")
                + f", which carryover-hf's generate hook wraps. Install transformers{supported}."
            )


def _target_name(target_config: PretrainedConfig) -> str | None:
    return getattr(target_config, "_name_or_path", None) or None


def check_compatibility(
    drafter_config: CarryoverDrafterConfig, target_config: PretrainedConfig, check_name: bool = True
) -> None:
    """Raises `DrafterTargetMismatchError` naming every field where the drafter's recorded target differs.

    Hidden size, layer count, vocabulary and layer ids are always checked; the name only with `check_name`
    (names differ harmlessly between a Hub id and a local copy of the same model).
    """
    text = target_config.get_text_config()
    problems = []
    if drafter_config.target_hidden_size != text.hidden_size:
        problems.append(f"hidden size: drafter expects {drafter_config.target_hidden_size}, target has {text.hidden_size}")
    if drafter_config.target_num_hidden_layers != text.num_hidden_layers:
        problems.append(
            f"layer count: drafter expects {drafter_config.target_num_hidden_layers}, target has {text.num_hidden_layers}"
        )
    if drafter_config.vocab_size != text.vocab_size:
        problems.append(f"vocabulary: drafter expects {drafter_config.vocab_size}, target has {text.vocab_size}")
    out_of_range = [i for i in drafter_config.target_layer_ids if not 0 <= i < text.num_hidden_layers]
    if out_of_range:
        problems.append(f"target_layer_ids {out_of_range} do not exist in a target with {text.num_hidden_layers} layers")
    recorded, actual = drafter_config.target_name_or_path, _target_name(target_config)
    if check_name and recorded and actual and recorded != actual:
        problems.append(
            f"name: drafter was trained for {recorded!r}, target is {actual!r} "
            "(pass ignore_target_name=True if this is the same model under another name)"
        )
    if problems:
        raise DrafterTargetMismatchError(
            "This drafter was made for another target:\n  - "
            + "\n  - ".join(problems)
            + "\nUse a drafter trained for this target, or build one with "
            "CarryoverDrafterConfig.from_target_config(target.config)."
        )


def supports_layer_hidden_states(target: PreTrainedModel) -> bool:
    """Whether `target(..., output_hidden_states=[...])` returns per-layer hidden states."""
    return any(
        "hidden_states" in (getattr(module, "_can_record_outputs", None) or {})
        for module in target.modules()
        if isinstance(module, PreTrainedModel)
    )


def check_target(target: PreTrainedModel) -> None:
    """The target must be a decoder-only model whose per-layer hidden states can be requested by index."""
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError(
            f"{type(target).__name__} is an encoder-decoder model; Carryover drafting needs a decoder-only causal LM."
        )
    if not supports_layer_hidden_states(target):
        raise ValueError(
            f"{type(target).__name__} cannot return per-layer hidden states (`output_hidden_states=[...]`), which the "
            "drafter reads as context. Use a Transformers causal LM whose outputs record hidden states "
            "(Llama, Qwen3, Mistral, Gemma, ...)."
        )
    if target.get_input_embeddings() is None or target.get_output_embeddings() is None:
        raise ValueError(
            f"{type(target).__name__} must expose its input embedding and LM head "
            "(`get_input_embeddings()` / `get_output_embeddings()`): the drafter shares both."
        )


def check_single_sequence(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """Transformers' assisted decoding runs one sequence at a time, without padding."""
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"Carryover drafting got a batch of {input_ids.shape[0]} sequences, but Transformers' assisted decoding "
            "generates one sequence at a time. Call generate once per prompt (batch size 1)."
        )
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            "The attention mask has padded positions; assisted decoding runs one sequence at a time, so tokenize the "
            "prompt without padding."
        )


__all__ = [
    "DrafterTargetMismatchError",
    "check_compatibility",
    "check_transformers_version",
    "check_target",
    "check_single_sequence",
    "supports_layer_hidden_states",
]
