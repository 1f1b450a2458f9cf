"""Start a new drafter from the target's own weights instead of random ones.

The drafter's final norm feeds the target's LM head, so the target's final norm is the natural start for it; and a
drafter layer has the shapes of a target decoder layer when it is built with `from_target_config`, so a chosen
target layer (a late one: its outputs are closest to what the LM head reads) can seed it. Weights that a target layer
lacks (Qwen3-style q/k norms for a Llama target) keep their default initialisation.
"""

from __future__ import annotations

import copy

import torch
from transformers.utils import logging

from ..modeling_carryover import CarryoverDrafterModel

logger = logging.get_logger(__name__)

_LAYER_WEIGHTS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def _decoder(target):
    base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)
    if not hasattr(base, "layers") or not hasattr(base, "norm"):
        raise ValueError(f"{type(target).__name__} has no `layers` and `norm` to initialise a drafter from.")
    return base


def last_layers(drafter: CarryoverDrafterModel, target) -> int:
    """The first of the target's last `len(drafter.layers)` layers: the default layer to initialise from."""
    return len(_decoder(target).layers) - len(drafter.layers)


@torch.no_grad()
def initialize_from_target(
    drafter: CarryoverDrafterModel, target, final_norm: bool = True, layer: int | None = None, strict: bool = True
) -> dict[str, str]:
    """Copy the target's final norm (and, with `layer`, target layers `layer, layer + 1, ...` into drafter layers
    `0, 1, ...`) into `drafter`. Returns what was copied: drafter name -> target name.

    Raises if a requested layer is out of range; weights whose shapes differ are an error too (build the drafter
    with `CarryoverDrafterConfig.from_target_config` so that they match), unless `strict=False`, which copies no
    layer weights then (the final norm still) and says so in a warning.
    """
    decoder = _decoder(target)
    copied: dict[str, str] = {}
    if final_norm:
        drafter.norm.weight.copy_(decoder.norm.weight)
        copied["norm.weight"] = "final norm"
    if layer is None:
        return copied
    count = len(drafter.layers)
    if not 0 <= layer <= len(decoder.layers) - count:
        raise ValueError(
            f"init layer {layer}: the target has {len(decoder.layers)} layers and the drafter {count}, so the first "
            f"copied layer must be in [0, {len(decoder.layers) - count}]."
        )
    pairs = []
    for i, drafter_layer in enumerate(drafter.layers):
        source = dict(decoder.layers[layer + i].named_parameters())
        mine = dict(drafter_layer.named_parameters())
        for name in _LAYER_WEIGHTS:
            if name not in source or name not in mine:
                continue
            if source[name].shape != mine[name].shape:
                message = (
                    f"target layer {layer + i} {name} has shape {tuple(source[name].shape)}, the drafter's "
                    f"{tuple(mine[name].shape)}: build the drafter with from_target_config to match the target."
                )
                if strict:
                    raise ValueError(message)
                logger.warning(f"{message} No target layer weights were copied.")
                return copied
            pairs.append((f"layers.{i}.{name}", f"layers.{layer + i}.{name}", mine[name], source[name]))
    for mine_name, source_name, mine, source in pairs:
        mine.copy_(source)
        copied[mine_name] = source_name
    return copied


@torch.no_grad()
def grow_layers(drafter: CarryoverDrafterModel, target, num_layers: int) -> CarryoverDrafterModel:
    """A deeper copy of a trained `drafter` that computes exactly what it did: its layers first, then new ones up to
    `num_layers`, each a copy of the target's last layer with its output projections (`o_proj`, `down_proj`) zeroed,
    so a new layer adds nothing to the residual stream until training moves them (their other weights start where a
    new drafter's would: `initialize_from_target`). Everything else (embeddings of the context, norms, heads, draft
    vocabulary) is the drafter's own. `drafter` is left as it is.
    """
    have = drafter.config.num_hidden_layers
    if num_layers < have:
        raise ValueError(f"grow_layers: the drafter has {have} layers already; it cannot grow to {num_layers}.")
    config = copy.deepcopy(drafter.config)
    config.num_hidden_layers = num_layers
    grown = CarryoverDrafterModel(config).to(dtype=drafter.dtype, device=drafter.device)
    missing, unexpected = grown.load_state_dict(drafter.state_dict(), strict=False)
    new = {key for key in grown.state_dict() if key.startswith("layers.") and int(key.split(".")[1]) >= have}
    if unexpected or not set(missing) <= new:
        raise ValueError(f"grow_layers: the drafter's weights do not fit its deeper copy ({sorted(unexpected)[:3]}, "
                         f"{sorted(set(missing) - new)[:3]}).")  # fmt: skip
    source = _decoder(target).layers[-1]
    for layer in grown.layers[have:]:
        layer.load_state_dict(_target_layer_weights(source, layer), strict=False)
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    grown.generation_config = copy.deepcopy(drafter.generation_config)  # its proposal defaults, not shared
    return grown


def _target_layer_weights(source, layer) -> dict[str, torch.Tensor]:
    """The weights of target layer `source` that drafter `layer` has, by name, where their shapes agree."""
    mine = dict(layer.named_parameters())
    return {name: weight for name, weight in source.named_parameters()
            if name in _LAYER_WEIGHTS and name in mine and mine[name].shape == weight.shape}  # fmt: skip


__all__ = ["grow_layers", "initialize_from_target", "last_layers"]
