"""`CarryoverTrainer`: the Transformers `Trainer` for drafters, with a frozen target alongside."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.utils import logging

from ..compatibility import check_compatibility, check_target
from ..modeling_carryover import CarryoverDrafterModel
from ..utils import resolve_auto_bfloat16
from .arguments import DECODING_MAX_TOKENS, OBJECTIVES, CarryoverTrainingArguments
from .collator import CarryoverDataCollator
from .data import check_training_dataset, row_lengths
from .feature_store import FeatureStore
from .lora import base_drafter, is_peft_model, load_extra_trainable_state, save_extra_trainable_state
from .losses import DISTILLATION_KINDS, default_gamma
from .objectives import DrafterObjective, metric_names
from .replay import decoding_tau
from .verification import check_target_attention

logger = logging.get_logger(__name__)

_DEFAULTS = {"num_anchors": 512, "loss_decay_gamma": None, "distillation": None, "distillation_weight": 0.9,
             "anchor_skip_repeated": 0, "carryover_plain_weight": 0.0, "eval_decoding_tau": True,
             "eval_decoding_max_tokens": DECODING_MAX_TOKENS}  # fmt: skip


class _AnchorEpochCallback(TrainerCallback):
    """Gives the collator the epoch number, so that each epoch samples new anchors (and a resumed run the same)."""

    def __init__(self, collator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        # `state.epoch` is fractional mid-epoch (e.g. on resume); the epoch index is its integer part.
        self.collator.set_epoch(math.floor((state.epoch or 0.0) + 1e-9))


class _TimeLimitCallback(TrainerCallback):
    """`max_train_seconds`: ends training after the step that passes the limit (timed from the first step)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is not None and time.monotonic() - self.started >= self.seconds:
            logger.warning(f"max_train_seconds={self.seconds:g} reached at step {state.global_step}: training ends.")
            control.should_training_stop = True


class _SeededLengthGroupedSampler(LengthGroupedSampler):
    """Length-grouped batches drawn from a generator seeded by (seed, epoch), which accelerate's dataloader sets each
    epoch: a resumed run draws the epoch it stopped in again, in the same order. (Transformers' sampler draws from the
    global RNG, which a resume restores only after the epoch's draw, so a run resumed mid-epoch saw other batches than
    one that never stopped.)"""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return super().__iter__()


class CarryoverTrainer(Trainer):
    r"""
    Trains a [`CarryoverDrafterModel`] (or a PEFT-wrapped one) against a frozen target.

    ```python
    trainer = CarryoverTrainer(
        model=drafter, target_model=target, args=CarryoverTrainingArguments(output_dir="out"),
        train_dataset=dataset, objective="carryover",
    )
    trainer.train()
    ```

    The target is frozen, kept in eval mode, moved to the training device, and is no part of the optimizer or of any
    checkpoint: checkpoints hold the drafter alone (safetensors). `args` may be plain [`TrainingArguments`]; the
    objective fields of [`CarryoverTrainingArguments`] then take their defaults, and `objective` given here
    overrides the one in `args`.

    The loss is the position-weighted loss summed over anchors and divided by the number of anchors of the whole
    accumulated (and, across processes, global) batch, so gradient accumulation matches one large batch.
    """

    # compute_loss already divides by the anchors of the whole accumulated batch.
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: CarryoverDrafterModel | nn.Module | None = None,
        target_model: PreTrainedModel | None = None,
        args: TrainingArguments | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        objective: str | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers=(None, None),
        **kwargs: Any,
    ):
        if model is None:
            raise ValueError("CarryoverTrainer needs `model`: the drafter to train.")
        if target_model is None:
            raise ValueError(
                "CarryoverTrainer needs `target_model`: the frozen target whose states the drafter reads."
            )
        drafter = base_drafter(model)
        if not isinstance(drafter, CarryoverDrafterModel):
            raise TypeError(
                f"`model` must be a CarryoverDrafterModel (optionally PEFT-wrapped), got {type(model).__name__}."
            )
        if args is None:
            args = CarryoverTrainingArguments(output_dir="tmp_trainer")
        options = {name: getattr(args, name, default) for name, default in _DEFAULTS.items()}
        self.objective = objective if objective is not None else getattr(args, "objective", "dflash")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}.")
        if options["distillation"] not in (None, *DISTILLATION_KINDS):
            raise ValueError(f"distillation must be one of {DISTILLATION_KINDS} or None.")

        # Everything that can be wrong with the inputs is checked before any model work.
        drafter.config.validate_carryover()
        check_target(target_model)
        check_compatibility(drafter.config, target_model.config, check_name=False)
        check_target_attention(target_model)
        text = target_model.config.get_text_config()
        max_length = getattr(text, "max_position_embeddings", None)
        check_training_dataset(train_dataset, text.vocab_size, max_length, "train_dataset")
        if isinstance(eval_dataset, dict):
            for name, dataset in eval_dataset.items():
                check_training_dataset(dataset, text.vocab_size, max_length, f"eval_dataset[{name!r}]")
        else:
            check_training_dataset(eval_dataset, text.vocab_size, max_length, "eval_dataset")
        eval_sets = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
        for dataset in [train_dataset, *eval_sets]:
            if isinstance(dataset, FeatureStore):
                # Offline features must come from this target and hold this drafter's layers.
                dataset.check_compatible(drafter.config.target_layer_ids, target_model)
                if options["distillation"] and self.objective == "dflash" and not dataset.has_topk:
                    raise ValueError(
                        f"--distillation {options['distillation']} needs the target's distribution, and {dataset.path} "
                        "stores no top-k log-probabilities: rebuild it with `carryover-hf features --top_k K`."
                    )

        if data_collator is None:
            pad = text.pad_token_id if isinstance(getattr(text, "pad_token_id", None), int) else 0
            seed = args.data_seed if args.data_seed is not None else args.seed
            data_collator = CarryoverDataCollator(num_anchors=options["num_anchors"], seed=seed, pad_token_id=pad,
                                                  skip_repeated=options["anchor_skip_repeated"])  # fmt: skip
        if args.ddp_find_unused_parameters is None:
            # The LM-head path runs outside the drafter's forward; DDP's unused-parameter search would misread it.
            args.ddp_find_unused_parameters = False

        # E_carry is trained only by the carryover objective; frozen otherwise so that every trainable parameter
        # gets a gradient at every step (DDP needs that without the unused-parameter search).
        drafter.carry_embedding.requires_grad_(self.objective == "carryover")
        if self.objective == "carryover":
            drafter.config.trained_with_carryover = True
        # The saved proposal default carries only where the carry segment was trained (a drafter trained by the dflash
        # objective alone would otherwise draft with an untrained E_carry in every `generate` call that follows it).
        drafter.generation_config.use_carryover = bool(drafter.config.trained_with_carryover)

        target_model.requires_grad_(False)
        target_model.eval()
        self.target_model = target_model
        gamma = options["loss_decay_gamma"] or default_gamma(drafter.config.block_size)
        self.drafter_objective = DrafterObjective(
            target_model, self.objective, gamma, options["distillation"], options["distillation_weight"],
            plain_weight=options["carryover_plain_weight"],
        )
        self._metric_names = metric_names(self.objective, drafter.config.block_size)
        self._metric_sums: dict[str, torch.Tensor] = {}
        self.decoding_replay = options["eval_decoding_tau"], options["eval_decoding_max_tokens"]
        if self.decoding_replay[1] is not None and self.decoding_replay[1] < 2:
            raise ValueError(f"eval_decoding_max_tokens must be at least 2 or None, got {self.decoding_replay[1]}.")

        callbacks = list(callbacks or [])
        if hasattr(data_collator, "set_epoch"):
            callbacks.append(_AnchorEpochCallback(data_collator))
        if getattr(args, "max_train_seconds", None):
            callbacks.append(_TimeLimitCallback(args.max_train_seconds))
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            **kwargs,
        )
        # Transformers before 5.23 has no `loss_is_scaled_for_ga`: it reads this flag (with a count of the batch's
        # items) to leave the loss of an accumulated batch unscaled.
        self.model_accepts_loss_kwargs = True
        if not getattr(target_model, "hf_device_map", None) and not getattr(target_model, "is_quantized", False):
            target_model.to(self.args.device)

    # -- data: the collator needs the raw columns ----------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        """`--train_sampling_strategy group_by_length` batches rows of similar length together (less padding of
        the context rows, which the fusion and attention pay for). The lengths come from the tokens alone: a feature
        store's offsets, a dataset's `input_ids`; Transformers' own sampler would read every row, features and all."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy == "group_by_length" and dataset is not None:
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return _SeededLengthGroupedSampler(batch, row_lengths(dataset), self.args.data_seed or self.args.seed)
        return super()._get_train_sampler(train_dataset)

    def get_eval_dataloader(self, eval_dataset=None):
        """Evaluation draws its anchors from every position: `anchor_skip_repeated` shapes training only."""
        collator = self.data_collator
        if isinstance(collator, CarryoverDataCollator) and collator.skip_repeated:
            self.data_collator = dataclasses.replace(collator, skip_repeated=0)
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = collator

    def _remove_unused_columns(self, dataset, description: str | None = None):
        return dataset

    def _get_collator_with_removed_columns(self, data_collator, description: str | None = None):
        return data_collator

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        """The anchors of the whole accumulated batch (summed over processes when tokens are averaged)."""
        if not batch_samples or "anchor_mask" not in batch_samples[0]:
            return None
        count = sum(batch["anchor_mask"].sum() for batch in batch_samples).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            count = self.accelerator.gather(count).sum()
        return count

    # -- loss ----------------------------------------------------------------------------------------------------
    def _unwrapped_drafter(self, model: nn.Module) -> CarryoverDrafterModel:
        return base_drafter(self.accelerator.unwrap_model(model))

    def _run_objective(self, model: nn.Module, inputs: dict[str, torch.Tensor], mode: str):
        output = self.drafter_objective(model, self._unwrapped_drafter(model), inputs)
        self._record_metrics(mode, output.metrics)
        return output

    @functools.cached_property
    def train_autocast(self) -> torch.dtype | None:
        """The dtype of the training steps' CPU autocast (`cpu_autocast`), or None."""
        choice = getattr(self.args, "cpu_autocast", None)
        if choice is None or self.args.device.type != "cpu":
            if choice == "bfloat16":
                raise ValueError("cpu_autocast is for training on a CPU; on a GPU use --bf16.")
            return None
        return torch.bfloat16 if resolve_auto_bfloat16(choice) == "bfloat16" else None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if model.training else "eval"
        dtype = self.train_autocast if mode == "train" else None
        autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            output = self._run_objective(model, inputs, mode)
        if num_items_in_batch is None:
            loss = output.loss_sum / output.num_anchors.clamp(min=1)
        else:
            loss = output.loss_sum / torch.as_tensor(num_items_in_batch).clamp(min=1)
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
                # DDP averages gradients over processes; the count above is already global.
                loss = loss * self.args.world_size
        return (loss, output) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            output = self._run_objective(model, inputs, "eval")
        loss = (output.loss_sum / output.num_anchors.clamp(min=1)).detach()
        return loss, None, None

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix: str = "eval"):  # fmt: skip
        """The Trainer's loop, then (with `eval_decoding_tau`) greedy decoding replayed on the same rows:
        `<prefix>_tau_decoding`, the plain draft's acceptance length along decoding rounds."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        enabled, max_tokens = self.decoding_replay
        if enabled:
            drafter = self._unwrapped_drafter(self.model)
            tau = decoding_tau(self.drafter_objective, drafter, dataloader.dataset, (max_tokens,))[max_tokens]
            output.metrics[f"{metric_key_prefix}_tau_decoding"] = round(tau, 4)
        return output

    # -- metrics -------------------------------------------------------------------------------------------------
    def _record_metrics(self, mode: str, metrics: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        if mode not in self._metric_sums:
            self._metric_sums[mode] = torch.zeros(2, len(self._metric_names), device=self.args.device)
        sums = self._metric_sums[mode]
        for i, name in enumerate(self._metric_names):
            if name in metrics:
                value, count = metrics[name]
                sums[0, i] += value.detach().to(sums.device)
                sums[1, i] += count.detach().to(sums.device)

    def _pop_metrics(self, mode: str) -> dict[str, float]:
        sums = self._metric_sums.pop(mode, None)
        if sums is None:
            sums = torch.zeros(2, len(self._metric_names), device=self.args.device)
        if self.args.world_size > 1:
            # Every process logs at the same steps, so this collective is matched.
            sums = self.accelerator.reduce(sums, reduction="sum")
        return {
            name: round(float(sums[0, i] / sums[1, i]), 4)
            for i, name in enumerate(self._metric_names)
            if sums[1, i] > 0
        }

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(self._pop_metrics("train"))
        elif any(key.endswith("_loss") and key.startswith("eval") for key in logs):
            prefix = next(key for key in logs if key.endswith("_loss") and key.startswith("eval"))[: -len("loss")]
            logs.update({prefix + name: value for name, value in self._pop_metrics("eval").items()})
        super().log(logs, start_time)

    # -- checkpoints: the drafter alone ----------------------------------------------------------------------------
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save and is_peft_model(self.model):
            save_extra_trainable_state(self.model, output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if is_peft_model(self.model):
            load_extra_trainable_state(self.model, resume_from_checkpoint)


__all__ = ["CarryoverTrainer"]
