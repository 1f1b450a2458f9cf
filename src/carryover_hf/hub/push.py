"""`carryover-hf push` and `push_to_hub`: save a drafter, render its card, upload the folder through huggingface_hub."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.utils import validate_repo_id
from transformers.utils import GENERATION_CONFIG_NAME

from ..configuration_carryover import PROPOSAL_OPTIONS, CarryoverDrafterConfig, check_proposal_defaults
from ..modeling_carryover import CarryoverDrafterModel
from .card import evaluation_from_bench, render_model_card
from .checkpoints import CheckpointError, read_config, safetensors_files


def _read_drafter_config(source: Path) -> dict:
    """The raw config of a saved drafter folder, or a `CheckpointError` saying what the folder is instead."""
    if not source.is_dir():
        raise CheckpointError(f"{source} is not a folder; pass a saved drafter folder or a CarryoverDrafterModel.")
    raw = read_config(source)
    if raw.get("model_type") != CarryoverDrafterConfig.model_type:
        raise CheckpointError(
            f"{source} is not a Carryover drafter (model_type={raw.get('model_type')!r}); "
            "import DFlash checkpoints first with `carryover-hf convert`."
        )
    return raw


def _write_weights(drafter: CarryoverDrafterModel | str | Path, folder: Path) -> tuple[CarryoverDrafterConfig, Any]:
    """The drafter's config, generation config (its proposal defaults) and safetensors weights in `folder` (nothing
    else is copied from a source folder); returns the config and the generation config (`None`: an older folder
    without generation_config.json, whose config.json holds the defaults)."""
    if isinstance(drafter, CarryoverDrafterModel):
        drafter.save_pretrained(folder, safe_serialization=True)
        return drafter.config, drafter.generation_config
    source = Path(drafter)
    raw = _read_drafter_config(source)
    names = ["config.json", "model.safetensors.index.json", GENERATION_CONFIG_NAME]
    for file in [*(source / name for name in names if (source / name).is_file()), *safetensors_files(source)]:
        shutil.copy2(file, folder / file.name)
    saved = source / GENERATION_CONFIG_NAME
    return CarryoverDrafterConfig.from_dict(raw), json.loads(saved.read_text()) if saved.is_file() else None


def build_upload_folder(
    drafter: CarryoverDrafterModel | str | Path,
    folder: str | Path,
    repo_id: str,
    **card_kwargs: Any,
) -> Path:
    """Write exactly what `push_to_hub` uploads: config.json, generation_config.json (the proposal defaults),
    safetensors weights and the rendered README.md."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise CheckpointError(f"{folder} is not empty; choose a new folder for the upload.")
    folder.mkdir(parents=True, exist_ok=True)
    config, generation_config = _write_weights(drafter, folder)
    render_model_card(config, repo_id=repo_id, generation_config=generation_config, **card_kwargs).save(
        folder / "README.md"
    )
    return folder


def push_to_hub(
    drafter: CarryoverDrafterModel | str | Path,
    repo_id: str,
    *,
    evaluation: Sequence[Mapping[str, Any]] | None = None,
    evaluation_note: str | None = None,
    training_data: str | None = None,
    objective: str | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    private: bool = False,
    token: str | bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    dry_run: str | Path | None = None,
    api: HfApi | None = None,
) -> str:
    """Save `drafter` (a model or a saved folder) with its model card and upload it to `repo_id`.

    The token comes from the usual places (`token=`, `HF_TOKEN`, `hf auth login`). With `dry_run=FOLDER` nothing is
    uploaded: the exact upload folder is written to FOLDER and its path returned. Otherwise returns the commit URL.
    """
    validate_repo_id(repo_id)
    card_kwargs = dict(
        evaluation=evaluation,
        evaluation_note=evaluation_note,
        training_data=training_data,
        objective=objective,
        base_model=base_model,
        license=license,
    )
    if dry_run is not None:
        return str(build_upload_folder(drafter, dry_run, repo_id, **card_kwargs))
    api = api or HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="carryover-push-") as tmp:
        folder = build_upload_folder(drafter, Path(tmp) / "upload", repo_id, **card_kwargs)
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            revision=revision,
            commit_message=commit_message or "Upload Carryover drafter",
        )
    return str(getattr(commit, "commit_url", commit))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carryover-hf push",
        description="Upload a saved drafter with its rendered model card to the Hugging Face Hub.",
    )
    parser.add_argument("drafter", help="folder of a saved Carryover drafter (config.json + *.safetensors)")
    parser.add_argument("repo_id", help="Hub repository, e.g. org/qwen3-4b-carryover-dflash")
    parser.add_argument("--evaluation", help="JSON file for the card's evaluation table: a list of rows {category, "
                        "acceptance_length, acceptance_length_ci, speedup, speedup_ci}, or a `carryover-hf bench` "
                        "results.json (then give --evaluation-method)")
    parser.add_argument("--evaluation-method", help="method of a bench report to show, e.g. carryover/carry_on")
    parser.add_argument("--evaluation-temperature", type=float, default=0.0, help="temperature of a bench report")
    parser.add_argument("--evaluation-note", help="text above the evaluation table (setup, hardware, prompts)")
    parser.add_argument("--training-data", help="training data description for the card")
    parser.add_argument("--objective", help="training objective for the card (default: from the config)")
    parser.add_argument("--base-model", help="target Hub id for the card metadata (default: the recorded target)")
    parser.add_argument("--license", default="apache-2.0", help="licence identifier for the card metadata")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                        help="cast the weights before upload (default: as saved); bf16/fp16 halve the download")
    parser.add_argument("--carry", choices=["on", "off"],
                        help="set use_carryover in the upload's generation_config.json (default: as saved); 'off' for "
                        "DFlash-trained "
                        "drafters that should draft as plain DFlash by default")
    for option in PROPOSAL_OPTIONS:  # the defaults a generate call starts from; 0 sets one off
        threshold = option == "draft_confidence_threshold"
        parser.add_argument(f"--{option.replace('_', '-')}", type=float if threshold else int,
                            metavar="T" if threshold else "N",
                            help=f"set {option} in the upload's generation_config.json (default: as saved): the "
                            "value each generate call uses unless it passes its own (docs/generate.md)")
    parser.add_argument("--round-policy", choices=["rules", "cost"],
                        help="set round_policy in the upload's generation_config.json (default: as saved): 'cost' "
                        "chooses each round by expected tokens per unit of cost, 'rules' runs the options above")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--revision", help="branch to push to")
    parser.add_argument("--commit-message", help="commit message")
    parser.add_argument("--dry-run", metavar="FOLDER", help="write the exact upload folder to FOLDER; upload nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        evaluation = None
        if args.evaluation:
            if not Path(args.evaluation).is_file():
                raise ValueError(f"--evaluation {args.evaluation} does not exist; give a JSON file of evaluation rows "
                                 "or a bench report (results.json).")  # fmt: skip
            evaluation = json.loads(Path(args.evaluation).read_text())
            if isinstance(evaluation, dict) and "results" in evaluation:
                if not args.evaluation_method:
                    raise ValueError(f"{args.evaluation} is a bench report; say which method with --evaluation-method.")
                evaluation = evaluation_from_bench(evaluation, args.evaluation_method, args.evaluation_temperature)
            if not isinstance(evaluation, list):
                raise ValueError(f"{args.evaluation} must hold a JSON list of evaluation rows or a bench report.")
        drafter = args.drafter
        defaults = {option: getattr(args, option) for option in (*PROPOSAL_OPTIONS, "round_policy")
                    if getattr(args, option) is not None}  # fmt: skip
        if args.dtype or args.carry or defaults:
            import torch

            _read_drafter_config(Path(drafter))
            dtype = getattr(torch, args.dtype) if args.dtype else "auto"
            drafter = CarryoverDrafterModel.from_pretrained(drafter, dtype=dtype)
            if args.carry:
                drafter.generation_config.use_carryover = args.carry == "on"
            for option, value in defaults.items():
                setattr(drafter.generation_config, option, value)
            check_proposal_defaults(defaults)  # a bad value fails here, before anything is written
        result = push_to_hub(
            drafter,
            args.repo_id,
            evaluation=evaluation,
            evaluation_note=args.evaluation_note,
            training_data=args.training_data,
            objective=args.objective,
            base_model=args.base_model,
            license=args.license,
            private=args.private,
            revision=args.revision,
            commit_message=args.commit_message,
            dry_run=args.dry_run,
        )
    except (CheckpointError, ValueError, OSError) as error:
        print(f"carryover-hf push: error: {error}", file=sys.stderr)
        return 1
    print(f"Wrote the upload folder to {result}" if args.dry_run else f"Uploaded: {result}")
    return 0


__all__ = ["build_upload_folder", "main", "push_to_hub"]
