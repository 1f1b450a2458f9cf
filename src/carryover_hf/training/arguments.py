"""`TrainingArguments` plus the fields of the drafter objectives."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments
from transformers.trainer_utils import SchedulerType

from .losses import DISTILLATION_KINDS

OBJECTIVES = ("dflash", "carryover")
# Tokens of each eval response that the decoding replay covers (a generate call's max_new_tokens in the benchmarks).
DECODING_MAX_TOKENS = 128


@dataclass
class CarryoverTrainingArguments(TrainingArguments):
    r"""
    [`TrainingArguments`] for drafter training. Defaults follow DFlash's recipe (AdamW, lr 6e-4, cosine schedule,
    4 % warmup); columns are kept for the collator and DDP does not search for unused parameters (the trainer
    freezes what a step does not train, so every trainable parameter gets a gradient).

    Args:
        objective (`str`): `"dflash"` (baseline: parallel blocks at sampled anchors) or `"carryover"`
            (draft-verify-draft: trains the second draft on the target's states at the first draft's rejected rows).
        num_anchors (`int`): anchors sampled per sequence (DFlash: 512).
        loss_decay_gamma (`float`, *optional*): decay of the position weights `exp(-(j-1)/gamma)`; defaults to 7 for
            block size 16 (5 for 10, 4 for 8).
        distillation (`str`, *optional*): `"kl"` or `"tv"` to mix a divergence from the target's next-token
            distribution into the loss.
        distillation_weight (`float`): λ in `(1 - λ) CE + λ D` when `distillation` is set (DSpark: 0.9 with TV).
        max_train_seconds (`float`, *optional*): end training after the optimizer step that passes this many seconds
            of wall time (the schedule is not shortened: it stops where it is); the model is saved as at a normal end.
        carryover_plain_weight (`float`): with `objective="carryover"`, the loss adds this times the dflash loss of
            the first draft (trained with gradient then), so the plain draft keeps learning beside the draft after a
            rejection; 0 (default): the second draft alone.
        anchor_skip_repeated (`int`): draw no anchor where the last N tokens occurred earlier in the row (a looping
            answer's repeats, which a suffix match drafts at inference), so the drafter trains on new text; 0 (default):
            every anchor. The eval rows keep every anchor.
        eval_decoding_tau (`bool`): after each evaluation, draft at every anchor of the eval rows and replay
            full-block greedy decoding over them (`carryover_hf.training.replay`); logs `eval_tau_decoding`, the
            acceptance length decoding gets (exactly, on rows that are the target's own greedy output), next to
            `eval_tau_teacher_forced` (uniform anchors, which overstates it wherever acceptance varies).
        eval_decoding_max_tokens (`int`, *optional*): replay the first this many tokens of each response, as
            `max_new_tokens` would stop a call (default 128); `None`: whole responses.
    """

    objective: str = field(
        default="dflash", metadata={"help": "Training objective of the drafter.", "choices": list(OBJECTIVES)}
    )
    num_anchors: int = field(default=512, metadata={"help": "Anchors sampled per sequence (DFlash uses 512)."})
    loss_decay_gamma: float | None = field(
        default=None,
        metadata={"help": "gamma of the position weights exp(-(j-1)/gamma); default 7 for block size 16."},
    )
    distillation: str | None = field(
        default=None,
        metadata={
            "help": "Distill the target's next-token distribution: 'kl' or 'tv'.",
            "choices": list(DISTILLATION_KINDS),
        },
    )
    distillation_weight: float = field(
        default=0.9, metadata={"help": "Weight of the distillation term: (1 - w) * CE + w * divergence."}
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={"help": "End training after the step that passes this many seconds of wall time (a time-boxed run)."},
    )
    carryover_plain_weight: float = field(
        default=0.0,
        metadata={"help": "With the carryover objective, add this times the dflash loss of the first (plain) draft; "
                  "0: the draft after a rejection alone."},  # fmt: skip
    )
    anchor_skip_repeated: int = field(
        default=0,
        metadata={"help": "Draw no training anchor where the last N tokens occurred earlier in the row (repeated text "
                  "that a suffix match drafts at inference); 0: every anchor."},  # fmt: skip
    )
    cpu_autocast: str | None = field(
        default=None,
        metadata={"help": "On a CPU, run each training step's forward and loss under torch.autocast in this dtype "
                  "(float32 weights, optimizer and evaluation). 'bfloat16', or 'auto': bfloat16 where the CPU computes "
                  "it natively (AVX-512 BF16 or AMX), else off. None: off. On a GPU use --bf16."},  # fmt: skip
    )
    eval_decoding_tau: bool = field(
        default=True,
        metadata={"help": "After each evaluation, replay full-block greedy decoding on the eval rows and log "
                  "`eval_tau_decoding` (carryover_hf.training.replay)."},  # fmt: skip
    )
    eval_decoding_max_tokens: int | None = field(
        default=DECODING_MAX_TOKENS,
        metadata={"help": "Replay the first this many tokens of each eval response (a generate call's "
                  "max_new_tokens); None: whole responses."},  # fmt: skip
    )

    # DFlash's recipe instead of the generic Trainer defaults.
    learning_rate: float = field(default=6e-4, metadata={"help": "The initial learning rate for AdamW."})
    lr_scheduler_type: SchedulerType | str = field(
        default="cosine", metadata={"help": "The learning rate scheduler type to use."}
    )
    warmup_steps: float = field(
        default=0.04, metadata={"help": "Warmup steps, or a ratio of the total steps when in [0, 1)."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: the collator needs `input_ids` and `loss_mask`."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={
            "help": "False: the drafter's LM-head path runs outside its forward, which DDP's search would misread."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}.")
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be at least 1, got {self.num_anchors}.")
        if self.loss_decay_gamma is not None and self.loss_decay_gamma <= 0:
            raise ValueError(f"loss_decay_gamma must be positive, got {self.loss_decay_gamma}.")
        if self.distillation is not None and self.distillation not in DISTILLATION_KINDS:
            raise ValueError(f"distillation must be one of {DISTILLATION_KINDS} or None, got {self.distillation!r}.")
        if self.max_train_seconds is not None and self.max_train_seconds <= 0:
            raise ValueError(f"max_train_seconds must be positive, got {self.max_train_seconds}.")
        if self.cpu_autocast not in (None, "auto", "bfloat16"):
            raise ValueError(f"cpu_autocast must be None, 'auto' or 'bfloat16', got {self.cpu_autocast!r}.")
        if not 0.0 <= self.distillation_weight <= 1.0:
            raise ValueError(f"distillation_weight must lie in [0, 1], got {self.distillation_weight}.")


__all__ = ["OBJECTIVES", "CarryoverTrainingArguments"]
