"""Drafter training: `CarryoverTrainer` with the DFlash and the draft-verify-draft (Carryover) objectives."""

from .arguments import OBJECTIVES, CarryoverTrainingArguments
from .collator import CarryoverDataCollator, sample_anchors, valid_anchor_positions
from .data import check_training_dataset
from .lora import apply_lora, load_lora_drafter, merge_lora
from .objectives import DrafterObjective, ObjectiveOutput
from .trainer import CarryoverTrainer
from .verification import parallel_verify, target_forward

__all__ = [
    "OBJECTIVES",
    "CarryoverDataCollator",
    "CarryoverTrainer",
    "CarryoverTrainingArguments",
    "DrafterObjective",
    "ObjectiveOutput",
    "apply_lora",
    "check_training_dataset",
    "load_lora_drafter",
    "merge_lora",
    "parallel_verify",
    "sample_anchors",
    "target_forward",
    "valid_anchor_positions",
]
