"""Load a drafter next to its target, checking the recorded target before any weights are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PretrainedConfig, PreTrainedModel

from ..compatibility import check_compatibility, check_target
from ..configuration_carryover import CarryoverDrafterConfig
from ..modeling_carryover import CarryoverDrafterModel
from .checkpoints import CheckpointError


# from_pretrained arguments that also apply to reading the config alone
_HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "subfolder")


def load_drafter(
    pretrained_model_name_or_path: str | Path,
    target: PreTrainedModel,
    *,
    ignore_target_name: bool = False,
    **kwargs: Any,
) -> CarryoverDrafterModel:
    """`CarryoverDrafterModel.from_pretrained` that first checks the drafter was made for `target`.

    Hidden size, layer count, vocabulary and layer ids must match (`DrafterTargetMismatchError` names each
    difference). The recorded target name must match too, unless `ignore_target_name=True` (a local copy or a
    fine-tune of the same model); that option skips the name check only. The drafter is loaded in the target's dtype
    (unless `dtype` is given) and moved to the target's device.
    """
    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    config_dict, _ = PretrainedConfig.get_config_dict(str(pretrained_model_name_or_path), **hub_kwargs)
    if config_dict.get("model_type") != CarryoverDrafterConfig.model_type:
        raise CheckpointError(
            f"{pretrained_model_name_or_path} is not a Carryover drafter (model_type="
            f"{config_dict.get('model_type')!r}); import DFlash checkpoints with `carryover-hf convert SRC OUT`."
        )
    config = CarryoverDrafterConfig.from_dict(config_dict)
    check_target(target)
    check_compatibility(config, target.config, check_name=not ignore_target_name)
    kwargs.setdefault("dtype", target.dtype)
    drafter = CarryoverDrafterModel.from_pretrained(pretrained_model_name_or_path, config=config, **kwargs)
    return drafter.to(target.device).eval()


__all__ = ["load_drafter"]
