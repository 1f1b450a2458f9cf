"""The public DFlash checkpoint layouts and how each maps onto a Carryover drafter.

* z-lab DFlash (`architectures: ["DFlashDraftModel"]`, `model_type: "qwen3"`, `dflash_config: {mask_token_id,
  target_layer_ids}`): tensor names are already ours (`fc`, `hidden_norm`, `layers.N...`, `norm`).
* Transformers' `MuseGlimmerAssistantModel` (`model_type: "muse_glimmer_assistant"`): the context projection lives in
  `encoder.fc` / `encoder.output_norm_enc`; everything else matches. Its config records neither the target's layer
  count nor the vocabulary.
* vLLM speculators DFlash (`speculators_model_type: "dflash"`): decoder hyperparameters in `transformer_layer_config`,
  `aux_hidden_state_layer_ids` are `target_layer_ids + 1` (vLLM reads the residual stream entering a layer), and
  target-owned tensors (`embed_tokens`, `verifier_*`, full-vocabulary `lm_head`) may be stored next to the drafter's.

Every format's own layer math is the drafter's (pre-norm Qwen3 layers, q/k RMSNorm, context rows as extra K/V, the
block not causal), which is what makes a weight-for-weight import exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig

from .checkpoints import CheckpointError


SOURCE_FORMATS = ("zlab", "muse", "speculators")

# z-lab `dflash_config` keys; the last three are accepted only at their neutral values (1, 1, off).
_ZLAB_KNOWN = {
    "mask_token_id", "target_layer_ids", "block_size", "input_embedding_scale", "output_multiplier",
    "final_logit_softcapping",
}
_ZLAB_NON_LAYER_KEYS = {"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers"}
_SPECULATORS_TARGET_OWNED = {
    "embed_tokens.weight": "the target's input embedding (the drafter shares it)",
    "lm_head.weight": "the target's LM head (full vocabulary; the drafter shares it)",
    "verifier_lm_head.weight": "the verifier's LM head (the drafter shares the target's)",
    "verifier_norm.weight": "the verifier's final norm (not part of the drafter)",
    "t2d": "identity vocabulary map (full-vocabulary draft)",
    "d2t": "identity vocabulary map (full-vocabulary draft)",
}


@dataclass
class SourceCheckpoint:
    """What a checkpoint says about itself, in the drafter's terms."""

    format: str
    layers: PretrainedConfig  # decoder hyperparameters, normalised by Transformers' own config class
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    vocab_size: int | None = None
    target_hidden_size: int | None = None
    target_num_hidden_layers: int | None = None
    target_name_or_path: str | None = None
    rename: Callable[[str], str] = lambda name: name
    target_owned: dict[str, str] = field(default_factory=dict)  # tensors the drafter takes from the target
    sliding_layers: list[int] = field(default_factory=list)
    sliding_window: int | None = None
    dtype: Any = None


def detect_format(config: dict) -> str:
    """`zlab`, `muse`, `speculators` or `carryover`, from `config.json` alone."""
    architectures = config.get("architectures") or []
    if config.get("speculators_model_type") is not None:
        if config["speculators_model_type"] != "dflash":
            raise CheckpointError(
                f"This speculators checkpoint is {config['speculators_model_type']!r}; only 'dflash' drafters share "
                "the Carryover drafter's architecture."
            )
        return "speculators"
    if config.get("model_type") == "carryover_drafter":
        return "carryover"
    if config.get("model_type") == "muse_glimmer_assistant" or "MuseGlimmerAssistantModel" in architectures:
        return "muse"
    if "dflash_config" in config or any(a.startswith("DFlash") for a in architectures):
        return "zlab"
    raise CheckpointError(
        f"Cannot tell the checkpoint format (model_type={config.get('model_type')!r}, architectures={architectures}). "
        "Known: z-lab DFlash (dflash_config), Transformers MuseGlimmerAssistantModel, vLLM speculators DFlash "
        "(speculators_model_type='dflash') and Carryover drafters (model_type='carryover_drafter')."
    )


def _sliding(layer_types: list[str] | None) -> list[int]:
    return [i for i, kind in enumerate(layer_types or []) if kind == "sliding_attention"]


def _zlab(config: dict) -> SourceCheckpoint:
    architectures = config.get("architectures") or []
    if any(a != "DFlashDraftModel" for a in architectures):
        raise CheckpointError(
            f"z-lab architecture {architectures} is not plain DFlash: DFlash2 adds a candidate selector and dynamic "
            "convolutions that the Carryover drafter does not have. Only DFlashDraftModel checkpoints can be imported."
        )
    dflash = dict(config.get("dflash_config") or {})
    unknown = sorted(set(dflash) - _ZLAB_KNOWN)
    softcap = dflash.get("final_logit_softcapping")
    changed = [k for k in ("input_embedding_scale", "output_multiplier") if float(dflash.get(k, 1.0)) != 1.0]
    changed += ["final_logit_softcapping"] if softcap is not None and float(softcap) > 0 else []
    if unknown or changed:
        raise CheckpointError(
            f"dflash_config sets {unknown + changed}, which change the drafter's math (input scaling, logit "
            "multipliers/soft-capping or DFlash2 modules); the Carryover drafter reproduces plain DFlash only."
        )
    block_size = config.get("block_size") or dflash.get("block_size")
    mask = dflash.get("mask_token_id", config.get("mask_token_id"))
    ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
    missing = [name for name, value in (("block_size", block_size), ("mask_token_id", mask)) if value is None]
    if ids is None:
        missing.append("dflash_config.target_layer_ids")
    if missing:
        raise CheckpointError(f"The z-lab config does not record {missing}; they are needed to draft.")
    layers = AutoConfig.for_model(
        config.get("model_type", "qwen3"), **{k: v for k, v in config.items() if k not in _ZLAB_NON_LAYER_KEYS | {"model_type"}}
    )
    sliding = _sliding(config.get("layer_types"))
    if sliding and config.get("is_causal") is not False:
        raise CheckpointError(
            f"Layers {sliding} are sliding-window layers, which z-lab's DFlash code runs with causal attention inside "
            "the block unless the config sets is_causal=false; the Carryover drafter's block is bidirectional."
        )
    return SourceCheckpoint(
        format="zlab",
        layers=layers,
        target_layer_ids=[int(i) for i in ids],
        block_size=int(block_size),
        mask_token_id=int(mask),
        vocab_size=config.get("vocab_size"),
        target_hidden_size=config.get("target_hidden_size"),
        target_num_hidden_layers=config.get("num_target_layers"),
        sliding_layers=sliding,
        sliding_window=layers.sliding_window if sliding else None,
        dtype=layers.dtype,
    )


# MuseGlimmerAssistantModel tensor name -> Carryover name; every other tensor keeps its name.
MUSE_RENAMES = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}


def _muse_rename(name: str) -> str:
    name = name.removeprefix("model.")
    return MUSE_RENAMES.get(name, name)


def _muse(config: dict) -> SourceCheckpoint:
    # Transformers' own config class supplies Muse's defaults (rope theta 500000, rms eps 1e-5, sliding layers).
    layers = MuseGlimmerAssistantConfig.from_dict({k: v for k, v in config.items() if k != "architectures"})
    sliding = _sliding(layers.layer_types)
    return SourceCheckpoint(
        format="muse",
        layers=layers,
        target_layer_ids=[int(i) for i in layers.target_layer_ids],
        block_size=int(layers.block_size),
        mask_token_id=int(layers.mask_token_id),
        vocab_size=config.get("vocab_size"),
        rename=_muse_rename,
        sliding_layers=sliding,
        sliding_window=layers.sliding_window if sliding else None,
        dtype=layers.dtype,
    )


def _speculators(config: dict) -> SourceCheckpoint:
    layer_dict = dict(config.get("transformer_layer_config") or config.get("transformer_config") or {})
    if not layer_dict:
        raise CheckpointError("The speculators config has no transformer_layer_config.")
    for key in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"):
        if key in config and key not in layer_dict:  # vLLM reads these from the top level too
            layer_dict[key] = config[key]
    model_type = layer_dict.pop("model_type", "qwen3")
    layers = AutoConfig.for_model(model_type, **layer_dict)
    if config.get("projector_type", "dflash") != "dflash":
        raise CheckpointError(f"projector_type {config['projector_type']!r} adds modules plain DFlash does not have.")
    if config.get("sample_from_anchor"):
        raise CheckpointError(
            "sample_from_anchor=true drafts from the anchor row too (DSpark style); the Carryover drafter's anchor is "
            "the committed bonus token and proposes from rows 1.. only."
        )
    draft_vocab, vocab = config.get("draft_vocab_size"), layers.vocab_size
    if draft_vocab is not None and draft_vocab != vocab:
        raise CheckpointError(
            f"This speculator drafts over a reduced vocabulary ({draft_vocab} of {vocab} tokens, with d2t/t2d maps); "
            "the Carryover drafter uses the target's full LM head. Only full-vocabulary DFlash speculators import."
        )
    aux = config.get("aux_hidden_state_layer_ids")
    for key, value in (("aux_hidden_state_layer_ids", aux), ("mask_token_id", config.get("mask_token_id")),
                       ("block_size", config.get("block_size"))):
        if value is None:
            raise CheckpointError(f"The speculators config does not record {key}.")
    if any(int(i) < 1 for i in aux):
        raise CheckpointError(
            f"aux_hidden_state_layer_ids {aux} contain 0: speculators ids are target_layer_ids + 1, so 0 would be the "
            "embedding output, which DFlash drafters do not read."
        )
    sliding = _sliding(getattr(layers, "layer_types", None))
    if sliding and not config.get("sliding_window_non_causal", False):
        raise CheckpointError(
            f"Layers {sliding} use sliding-window attention that speculators runs causally inside the block "
            "(sliding_window_non_causal=false); the Carryover drafter's block is bidirectional."
        )
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return SourceCheckpoint(
        format="speculators",
        layers=layers,
        target_layer_ids=[int(i) - 1 for i in aux],
        block_size=int(config["block_size"]),
        mask_token_id=int(config["mask_token_id"]),
        vocab_size=vocab,
        target_hidden_size=config.get("target_hidden_size"),
        target_name_or_path=verifier,
        target_owned=dict(_SPECULATORS_TARGET_OWNED),
        sliding_layers=sliding,
        sliding_window=getattr(layers, "sliding_window", None) if sliding else None,
        dtype=layers.dtype,
    )


def parse_source(config: dict, source_format: str | None = None) -> SourceCheckpoint:
    """Read `config.json` of a z-lab, Muse or speculators checkpoint; rejects what the drafter cannot reproduce."""
    detected = detect_format(config)
    if source_format not in (None, "auto") and source_format != detected:
        raise CheckpointError(f"Asked to import a {source_format!r} checkpoint, but its config.json is {detected!r}.")
    if detected == "carryover":
        raise CheckpointError("This is already a Carryover drafter; load it with AutoModel.from_pretrained.")
    return {"zlab": _zlab, "muse": _muse, "speculators": _speculators}[detected](config)


__all__ = ["SOURCE_FORMATS", "SourceCheckpoint", "detect_format", "parse_source"]
