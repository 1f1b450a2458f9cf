"""`carryover-hf init`: ready drafter configs for real targets (shipped as package data,
`carryover_hf/assets/hub_configs/*.json`) turned into initialised drafters.

A hub config names the Hub repository the drafter is published under, its target, where its layout comes from, and
the full `CarryoverDrafterConfig`. `init_drafter` builds a freshly initialised drafter from it (`E_carry` and a
Markov head's `W2` start at zero) after checking the target's config when one is given.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import PretrainedConfig

from ..compatibility import DrafterTargetMismatchError, check_compatibility
from ..configuration_carryover import CarryoverDrafterConfig
from ..errors import InputNotFoundError, UsageError
from ..modeling_carryover import CarryoverDrafterModel
from ..resources import HUB_CONFIGS_DIR
from ..targets import load_target_config
from .card import render_model_card


REPO_NAME = re.compile(r"^[\w.-]+/(?P<target>[\w.-]+)-carryover-(?P<kind>dflash|markov)$")


@dataclass
class HubConfig:
    """One hub config file (`carryover_hf/assets/hub_configs/*.json`)."""

    name: str
    repo_id: str
    target: str
    config: CarryoverDrafterConfig
    layout_reference: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


def available_hub_configs(directory: str | Path = HUB_CONFIGS_DIR) -> list[str]:
    return sorted(path.stem for path in Path(directory).glob("*.json"))


def _resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = HUB_CONFIGS_DIR / f"{name_or_path}.json"
    if candidate.is_file():
        return candidate
    known = available_hub_configs() if HUB_CONFIGS_DIR.is_dir() else []
    raise InputNotFoundError(f"No hub config {name_or_path!r}: pass a JSON file or one of {known} (see `--list`).")


def load_hub_config(name_or_path: str | Path) -> HubConfig:
    """Read and validate a hub config: drafting fields, and a repo name of the form `org/<target>-carryover-<kind>`."""
    path = _resolve(name_or_path)
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} is not a hub config: not JSON ({error}).") from error
    missing = [key for key in ("repo_id", "target", "drafter_config") if key not in raw]
    if missing:
        raise UsageError(f"{path} lacks {missing}; a hub config needs repo_id, target and drafter_config.")
    try:  # the config validates its drafting fields on construction
        config = CarryoverDrafterConfig(**raw["drafter_config"])
    except (ValueError, TypeError, StrictDataclassClassValidationError) as error:
        raise UsageError(f"{path}: invalid drafter_config: {error.__cause__ or error}") from error
    match = REPO_NAME.match(raw["repo_id"])
    if match is None or match["kind"] != config.drafter_type:
        raise UsageError(
            f"{path}: repo_id {raw['repo_id']!r} must read 'org/<target>-carryover-{config.drafter_type}' for a "
            f"{config.drafter_type} drafter."
        )
    if config.target_name_or_path != raw["target"]:
        raise UsageError(f"{path}: drafter_config.target_name_or_path must equal target {raw['target']!r}.")
    return HubConfig(
        name=path.stem,
        repo_id=raw["repo_id"],
        target=raw["target"],
        config=config,
        layout_reference=raw.get("layout_reference", {}),
        sources=list(raw.get("sources", [])),
    )


def init_drafter(
    name_or_path: str | Path,
    *,
    target: str | PretrainedConfig | None = None,
    ignore_target_name: bool = True,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> CarryoverDrafterModel:
    """A freshly initialised drafter for a hub config.

    With `target` (a folder, Hub id or config; only the config is read), the drafter's recorded target is checked
    against it first. The name check is skipped by default (a local copy has another path); hidden size, layers and
    vocabulary always are checked.
    """
    hub = load_hub_config(name_or_path)
    if target is not None:
        target_config = target if isinstance(target, PretrainedConfig) else load_target_config(target)
        check_compatibility(hub.config, target_config, check_name=not ignore_target_name)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        drafter = CarryoverDrafterModel(hub.config)  # E_carry and the Markov W2 start at zero
    return drafter.to(dtype) if dtype is not None else drafter


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carryover-hf init",
        description="Initialise a drafter from a hub config (a shipped one, see --list, or a JSON file) and save it "
        "with its model card.",
    )
    parser.add_argument("config", nargs="?", help="hub config name (e.g. qwen3-4b-dflash) or JSON file")
    parser.add_argument("out", nargs="?", help="folder to save the initialised drafter to")
    parser.add_argument("--list", action="store_true", help="list the shipped hub configs and exit")
    parser.add_argument("--target", help="target folder or Hub id whose config is checked against the drafter's")
    parser.add_argument("--check-target-name", action="store_true", help="also require the target name to match")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for name in available_hub_configs():
            hub = load_hub_config(name)
            print(f"{name:24s} {hub.repo_id:40s} target {hub.target}")
        return 0
    if not args.config or not args.out:
        parser.error("CONFIG and OUT are required (or --list)")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"carryover-hf init: error: {out} is not empty; choose a new folder.", file=sys.stderr)
        return 1
    try:
        hub = load_hub_config(args.config)
        drafter = init_drafter(
            args.config,
            target=args.target,
            ignore_target_name=not args.check_target_name,
            seed=args.seed,
            dtype=getattr(torch, args.dtype),
        )
    except (DrafterTargetMismatchError, ValueError, FileNotFoundError, OSError) as error:
        print(f"carryover-hf init: error: {error}", file=sys.stderr)
        return 1
    drafter.save_pretrained(out)
    untrained = "not trained yet (freshly initialised)"
    render_model_card(drafter.config, repo_id=hub.repo_id, training_data=untrained, objective=untrained,
                      generation_config=drafter.generation_config).save(
        out / "README.md"
    )
    params = sum(p.numel() for p in drafter.parameters())
    print(f"Initialised {hub.name} ({params / 1e6:.1f}M parameters) for {hub.target} in {out}; publish as {hub.repo_id}.")
    return 0


__all__ = ["HubConfig", "available_hub_configs", "init_drafter", "load_hub_config", "main"]
