"""`carryover-hf train`: train or fine-tune a drafter with `CarryoverTrainer`.

Every `TrainingArguments` option is accepted (`--output_dir`, `--num_train_epochs`, `--per_device_train_batch_size`,
`--gradient_accumulation_steps`, `--bf16`, `--save_steps`, ...), plus the model, data and objective options below.
A single `.json` or `.yaml` file of all options also works: `carryover-hf train config.json`.

    carryover-hf train --target smollm2-135m --dataset data/train --objective dflash \
        --block_size 16 --drafter_layers 1 --output_dir runs/baseline --num_train_epochs 10
    carryover-hf train --target smollm2-135m --dataset data/train --objective carryover \
        --drafter runs/baseline --output_dir runs/carryover --num_train_epochs 3
    accelerate launch --num_processes 2 -m carryover_hf train ...   # many processes / GPUs
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser, set_seed
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from ..errors import UsageError
from .arguments import CarryoverTrainingArguments
from .data import load_rows

logger = logging.get_logger(__name__)


@dataclass
class ModelArguments:
    """The target, and the drafter to train (a new one, or an existing checkpoint to continue)."""

    target: str = field(
        default="smollm2-135m",
        metadata={"help": "Target: 'smollm2-135m' (offline SmolLM2-135M-Instruct), a local folder, or a Hub id."},
    )
    target_dtype: str = field(default="float32", metadata={"help": "Target dtype: float32, bfloat16, float16, auto."})
    target_attn_implementation: str = field(
        default="sdpa", metadata={"help": "Target attention: sdpa (CPU/GPU), eager, or flex_attention (GPU)."}
    )
    drafter: str | None = field(
        default=None,
        metadata={"help": "Drafter folder to continue from (e.g. a baseline); a new drafter is built when omitted."},
    )
    drafter_dtype: str = field(
        default="float32",
        metadata={
            "help": "Dtype a --drafter checkpoint is loaded in for training: float32 (master weights; --bf16 then "
            "autocasts the compute), bfloat16, float16 or auto (as saved). Published drafters are often saved in bf16.",
            "choices": ["float32", "bfloat16", "float16", "auto"],
        },
    )
    drafter_type: str | None = field(
        default=None,
        metadata={
            "help": "Drafter kind: dflash (the default of a new drafter) or markov. With --drafter: markov turns a dflash "
            "checkpoint into a Markov drafter (the backbone as trained, a new transition head whose W2 starts at zero, "
            "so training starts from the checkpoint's own proposals); omitted, the checkpoint keeps its kind.",
            "choices": ["dflash", "markov"],
        },
    )
    markov_inputs: str = field(
        default="auto",
        metadata={
            "help": "Rows of a Markov head's W1: draft (one per draft-vocabulary id plus one shared row for all other "
            "tokens: 4 instead of 25 MB in bf16 for SmolLM2 at 8,192 ids), full (one per token) or auto (draft for a "
            "new head of a drafter with a draft vocabulary, else full; an existing Markov checkpoint keeps its W1 "
            "unless draft is asked for).",
            "choices": ["auto", "draft", "full"],
        },
    )
    drafter_layers: int = field(
        default=1, metadata={"help": "Layers of a new drafter (the public DFlash drafters: 5)."}
    )
    block_size: int = field(
        default=16, metadata={"help": "Block size B of a new drafter (B - 1 proposals per round)."}
    )
    target_layer_ids: list[int] | None = field(
        default=None, metadata={"help": "Target layers a new drafter reads (default: spread as in DFlash)."}
    )
    mask_token_id: int | None = field(
        default=None,
        metadata={"help": "Mask token of a new drafter (default: the target's pad token, else the last id)."},
    )
    drafter_attn_implementation: str = field(
        default="sdpa", metadata={"help": "Drafter attention: sdpa, eager, or flex_attention (GPU)."}
    )
    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all drafter weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules to adapt (default: attention and MLP projections; add fc for fusion)."},
    )
    draft_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "New drafter: a reduced draft vocabulary of this many ids, built from the training set's response "
            "tokens (most frequent first, then the lowest ids); its held-out coverage is printed and saved to "
            "output_dir/draft_vocabulary.json. Default: the full vocabulary."
        },
    )
    init_from_target: bool = field(
        default=True,
        metadata={
            "help": "New drafter: start from the target's final norm and its last layers (the target layers "
            "L-n .. L-1 for an n-layer drafter, where shapes match); measured lower held-out loss, docs/training.md. "
            "--init_from_target false keeps Transformers' random initialisation."
        },
    )
    init_target_layer: int | None = field(
        default=None,
        metadata={"help": "New drafter: copy target layers L, L+1, ... instead of the last ones (shapes must match)."},
    )
    lora_merge: bool = field(
        default=False,
        metadata={"help": "Save merged weights to output_dir (adapter to output_dir/adapter) instead of the adapter."},
    )


@dataclass
class DataArguments:
    """Recorded target responses: rows with `input_ids` and `loss_mask`."""

    dataset: str = field(
        default=None,
        metadata={
            "help": "Training data: a `carryover-hf regenerate` output folder (or several, comma-separated: their "
            "finished chunks, run after run), a `save_to_disk` folder, or a .jsonl/.json/.parquet file."
        },
    )
    features: str | None = field(
        default=None,
        metadata={
            "help": "Offline target features (`carryover-hf features` output): rows and the target's states come from "
            "the store, and the dflash objective runs no target forward. --dataset is then optional (checked against "
            "the store when given)."
        },
    )
    eval_dataset: str | None = field(
        default=None, metadata={"help": "Evaluation data, same formats (several run folders: comma-separated)."}
    )
    eval_features: str | None = field(default=None, metadata={"help": "Evaluation rows as a feature store."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training rows."})


def _draft_vocabulary(model_args: ModelArguments, drafter, train_rows, eval_rows, output_dir: str) -> None:
    """Build the reduced draft vocabulary of a new drafter, print and record its coverage."""
    import json

    from .vocabulary import build_draft_vocabulary

    if eval_rows is not None:
        held_in, held_out, held_out_name = train_rows, eval_rows, "the evaluation rows"
    else:  # no evaluation set: hold out the last 5 % of the training rows for the coverage figure only
        split = max(1, len(train_rows) - max(1, len(train_rows) // 20))
        held_in = _first_rows(train_rows, split)
        held_out = [train_rows[i] for i in range(split, len(train_rows))]
        held_out_name = f"the last {len(held_out)} training rows (held out from the vocabulary)"
    ids, record = build_draft_vocabulary(held_in, held_out, drafter.config.vocab_size, model_args.draft_vocab_size)
    record["held_out"] = held_out_name
    drafter.set_draft_vocabulary(ids)
    logger.warning(
        f"Draft vocabulary: {len(ids)} ids cover {record['coverage_held_out']:.2%} of the response tokens of "
        f"{held_out_name} ({record['coverage_training']:.2%} of the training rows it was built from)."
    )
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "draft_vocabulary.json"), "w") as handle:
        json.dump(record, handle, indent=2)


def _first_rows(rows, count: int):
    from .feature_store import FeatureStore

    return rows.head(count) if isinstance(rows, FeatureStore) else rows.select(range(count))


def _build_drafter(model_args: ModelArguments, target, default_layer_ids: list[int] | None = None, prepare=None):
    from ..configuration_carryover import CarryoverDrafterConfig
    from ..modeling_carryover import CarryoverDrafterModel

    if model_args.drafter:
        from ..targets import resolve_dtype

        kind = _checkpoint_kind(model_args)
        extra = {"drafter_type": "markov"} if kind == "dflash" and model_args.drafter_type == "markov" else {}
        drafter = CarryoverDrafterModel.from_pretrained(
            model_args.drafter,
            attn_implementation=model_args.drafter_attn_implementation,
            dtype=resolve_dtype(model_args.drafter_dtype),
            **extra,
        )
        if extra:
            logger.warning(
                f"{model_args.drafter} is a dflash drafter: training it as a Markov drafter with a new transition head "
                f"(rank {drafter.config.markov_rank}, W2 = 0: the first proposals are the checkpoint's own)."
            )
        _restrict_markov_inputs(drafter, model_args.markov_inputs, new_head=bool(extra))
    else:
        overrides = {} if model_args.mask_token_id is None else {"mask_token_id": model_args.mask_token_id}
        config = CarryoverDrafterConfig.from_target_config(
            target.config,
            num_hidden_layers=model_args.drafter_layers,
            block_size=model_args.block_size,
            drafter_type=model_args.drafter_type or "dflash",
            target_layer_ids=model_args.target_layer_ids or default_layer_ids,
            **overrides,
        )
        config.target_name_or_path = target.config._name_or_path or model_args.target
        config._attn_implementation = model_args.drafter_attn_implementation
        drafter = CarryoverDrafterModel(config)
        if model_args.init_from_target or model_args.init_target_layer is not None:
            from .initialization import initialize_from_target, last_layers

            explicit = model_args.init_target_layer is not None
            layer = model_args.init_target_layer if explicit else last_layers(drafter, target)
            initialize_from_target(drafter, target, model_args.init_from_target, layer, strict=explicit)
        if prepare is not None:
            prepare(drafter)
        _restrict_markov_inputs(drafter, model_args.markov_inputs, new_head=True)
    if model_args.use_lora:
        from .lora import apply_lora

        drafter = apply_lora(
            drafter, model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout, model_args.lora_target_modules
        )
    return drafter


def _restrict_markov_inputs(drafter, mode: str, new_head: bool) -> None:
    """`--markov_inputs`: W1 rows for the draft vocabulary only (`CarryoverDrafterModel.restrict_markov_inputs`)."""
    if drafter.markov_head is None or mode == "full" or (mode == "auto" and not new_head):
        return
    if drafter.config.markov_input_vocab_size is not None:
        return  # already restricted
    if drafter.draft_token_ids is None:
        if mode == "draft":
            raise UsageError(
                "--markov_inputs draft needs a drafter with a draft vocabulary (--draft_vocab_size for a new one)."
            )
        return
    full = drafter.markov_head.token_embedding.weight.numel()
    drafter.restrict_markov_inputs()
    logger.warning(
        f"Markov head: W1 keeps rows for the {drafter.config.draft_vocab_size} draft-vocabulary ids plus one shared "
        f"row ({full:,} -> {drafter.markov_head.token_embedding.weight.numel():,} parameters)."
    )


def _checkpoint_kind(model_args: ModelArguments) -> str:
    """The kind of the --drafter checkpoint, checked against --drafter_type (a cheap check: the config alone)."""
    from ..configuration_carryover import CarryoverDrafterConfig

    try:
        kind = CarryoverDrafterConfig.from_pretrained(model_args.drafter).drafter_type
    except (OSError, ValueError) as error:
        raise UsageError(
            f"--drafter {model_args.drafter!r}: no Carryover drafter config there ({error}). Pass a saved drafter "
            "folder or Hub id, or omit --drafter to build a new drafter."
        ) from error
    if kind == "markov" and model_args.drafter_type == "dflash":
        raise UsageError(
            f"--drafter {model_args.drafter} is a Markov drafter; --drafter_type dflash would drop its trained "
            "transition head. Omit --drafter_type to continue it as it is."
        )
    return kind


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, CarryoverTrainingArguments]:
    parser = HfArgumentParser((ModelArguments, DataArguments, CarryoverTrainingArguments), prog="carryover-hf train")
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(argv[0])
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(argv[0])
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_args(argv)

    # Cheap checks first: the data, then the checkpoint to resume, then the models.
    from .feature_store import FeatureStore

    if model_args.drafter and (model_args.draft_vocab_size or model_args.init_target_layer is not None):
        raise UsageError("--draft_vocab_size and --init_target_layer apply to new drafters; drop them with --drafter.")
    if model_args.drafter:
        _checkpoint_kind(model_args)
    store = FeatureStore(data_args.features) if data_args.features else None
    source = data_args.features or data_args.dataset
    train_rows = store if store is not None else load_rows(data_args.dataset, "dataset")
    if data_args.max_train_samples is not None:
        if data_args.max_train_samples > len(train_rows):
            raise UsageError(
                f"--max_train_samples {data_args.max_train_samples}: {source} has only {len(train_rows)} "
                "rows. Lower it, or wait for more regenerated chunks."
            )
        train_rows = _first_rows(train_rows, data_args.max_train_samples)
    if store is not None and data_args.dataset:
        store.check_compatible(dataset=load_rows(data_args.dataset, "dataset"))
    if data_args.eval_features:
        eval_rows = FeatureStore(data_args.eval_features)
    else:
        eval_rows = load_rows(data_args.eval_dataset, "eval_dataset") if data_args.eval_dataset else None
    resume = training_args.resume_from_checkpoint
    if resume in ("last", "latest", "true", "True"):
        resume = get_last_checkpoint(training_args.output_dir) if os.path.isdir(training_args.output_dir) else None
        if resume is None:
            raise UsageError(f"--resume_from_checkpoint last: no checkpoint-* folder in {training_args.output_dir}.")
    elif resume is not None and not os.path.isdir(resume):
        raise UsageError(f"--resume_from_checkpoint {resume!r} is not a folder.")

    import carryover_hf  # noqa: F401  (registers the drafter with AutoModel)

    from ..targets import load_target
    from .trainer import CarryoverTrainer

    target, tokenizer = load_target(
        model_args.target, dtype=model_args.target_dtype, attn_implementation=model_args.target_attn_implementation
    )
    set_seed(training_args.seed)  # a new drafter starts from the same weights in every process and every rerun
    def new_drafter_vocabulary(drafter):
        if model_args.draft_vocab_size:
            _draft_vocabulary(model_args, drafter, train_rows, eval_rows, training_args.output_dir)

    drafter = _build_drafter(
        model_args, target, store.target_layer_ids if store is not None else None, new_drafter_vocabulary
    )
    trainer = CarryoverTrainer(
        model=drafter,
        target_model=target,
        args=training_args,
        train_dataset=train_rows,
        eval_dataset=eval_rows,
        processing_class=tokenizer,
    )
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if eval_rows is not None:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if model_args.use_lora and model_args.lora_merge:
        from .lora import merge_lora

        trainer.save_model(os.path.join(training_args.output_dir, "adapter"))
        if trainer.args.should_save:
            merge_lora(trainer.model).save_pretrained(training_args.output_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(training_args.output_dir)
    else:
        trainer.save_model()
    return 0


if __name__ == "__main__":
    sys.exit(main())
