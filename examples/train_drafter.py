"""Train a baseline drafter, then continue it (a) with the carryover objective and (b) with the baseline objective for
the same number of extra epochs (the continued-baseline control), and compare acceptance lengths in `generate`.

By default everything is tiny and random (a 4-layer target, self-generated data) and runs on a CPU in a few minutes:

    python examples/train_drafter.py --output_dir runs/example

With a real target and recorded responses (rows with `input_ids` and `loss_mask`):

    python examples/train_drafter.py --target smollm2-135m --dataset data/train --eval_dataset data/eval \
        --block_size 16 --drafter_layers 1 --baseline_epochs 10 --extra_epochs 3 --output_dir runs/smollm2

Evaluation prompts are the prompt parts (tokens before the first response token) of the evaluation rows; each drafter
generates `--max_new_tokens` greedily with the target and the mean acceptance length per round (bonus token included)
is reported. Every drafter is evaluated with carry rows off (`use_carryover=False`, plain DFlash drafting) and on.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GenerationConfig

import carryover_hf  # noqa: F401  (registers the drafter; hooks generate)
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.training import CarryoverTrainer, CarryoverTrainingArguments
from carryover_hf.training.cli import load_rows
from carryover_hf.training.synthetic import regenerate_random_prompts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="tiny", help="'tiny' (random 4-layer Llama), 'smollm2-135m', or a folder.")
    parser.add_argument("--dataset", help="Training rows (save_to_disk folder or json/parquet); default: synthetic.")
    parser.add_argument("--eval_dataset", help="Evaluation rows, same formats; default: synthetic held-out prompts.")
    parser.add_argument("--output_dir", default="runs/train_drafter_example")
    parser.add_argument("--drafter_type", default="dflash", choices=["dflash", "markov"])
    parser.add_argument("--drafter_layers", type=int, default=1)
    parser.add_argument("--block_size", type=int, default=8)
    parser.add_argument("--baseline_epochs", type=float, default=6)
    parser.add_argument("--extra_epochs", type=float, default=3)
    parser.add_argument("--num_anchors", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--num_rows", type=int, default=64, help="Synthetic training rows (tiny target only).")
    parser.add_argument("--num_eval_prompts", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_target(name: str):
    if name == "tiny":
        from carryover_hf.tools.tiny import tiny_target

        return tiny_target("llama", vocab_size=128, hidden_size=64, num_hidden_layers=4, seed=0), None
    from carryover_hf.targets import load_target as load

    return load(name, dtype="float32")


def train(drafter, target, rows, output_dir: str, objective: str, epochs: float, args) -> CarryoverDrafterModel:
    training_args = CarryoverTrainingArguments(
        output_dir=output_dir,
        objective=objective,
        num_train_epochs=epochs,
        per_device_train_batch_size=args.batch_size,
        num_anchors=args.num_anchors,
        learning_rate=args.learning_rate,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    trainer = CarryoverTrainer(model=drafter, target_model=target, args=training_args, train_dataset=rows)
    trainer.train()
    trainer.save_model(output_dir)
    return drafter


@torch.no_grad()
def acceptance(target, drafter, prompts, max_new_tokens: int, use_carryover: bool) -> dict:
    drafter.eval()
    # Carry on or off per call (the drafter's config stays as saved).
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0, use_carryover=use_carryover)
    lengths, carried, seconds = [], [], 0.0
    for prompt in prompts:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, generation_config=config)
        seconds += time.perf_counter() - start
        stats = drafter.last_generation_stats
        lengths += stats.acceptance_lengths
        carried += stats.carry_rows
    return {
        "mean_acceptance_length": round(sum(lengths) / len(lengths), 4),
        "rounds": len(lengths),
        "mean_carry_rows": round(sum(carried) / max(1, len(carried)), 3),
        "seconds": round(seconds, 2),
    }


def prompts_of(rows, limit: int) -> list[list[int]]:
    """The prompt part of each row: tokens before its first response token."""
    prompts = []
    for row in rows.select(range(min(limit, len(rows)))):
        first = row["loss_mask"].index(1) if 1 in row["loss_mask"] else len(row["loss_mask"])
        if first > 0:
            prompts.append(row["input_ids"][:first])
    return prompts


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    os.makedirs(args.output_dir, exist_ok=True)
    target, _tokenizer = load_target(args.target)

    if args.dataset:
        rows = load_rows(args.dataset)
    elif args.target == "tiny":
        rows = regenerate_random_prompts(target, num_rows=args.num_rows, prompt_length=8, response_length=48, seed=1)
    else:
        raise SystemExit("--dataset is required with a real target (rows with input_ids and loss_mask).")
    if args.eval_dataset:
        eval_rows = load_rows(args.eval_dataset)
    elif args.target == "tiny":
        eval_rows = regenerate_random_prompts(
            target, num_rows=args.num_eval_prompts, prompt_length=8, response_length=8, seed=2
        )
    else:
        eval_rows = rows
    train_prompts, held_out_prompts = (
        prompts_of(rows, args.num_eval_prompts),
        prompts_of(eval_rows, args.num_eval_prompts),
    )

    config = CarryoverDrafterConfig.from_target_config(
        target.config,
        num_hidden_layers=args.drafter_layers,
        block_size=args.block_size,
        drafter_type=args.drafter_type,
    )
    torch.manual_seed(args.seed)
    baseline = CarryoverDrafterModel(config)
    baseline_dir = os.path.join(args.output_dir, "baseline")
    train(baseline, target, rows, baseline_dir, "dflash", args.baseline_epochs, args)

    results = {"baseline": {}, "continued_baseline": {}, "carryover": {}}
    for name, objective in (("carryover", "carryover"), ("continued_baseline", "dflash")):
        drafter = CarryoverDrafterModel.from_pretrained(baseline_dir)
        train(drafter, target, rows, os.path.join(args.output_dir, name), objective, args.extra_epochs, args)

    for name, by_mode in results.items():
        drafter = CarryoverDrafterModel.from_pretrained(os.path.join(args.output_dir, name))
        for use_carryover in (False, True):
            key = "carry_on" if use_carryover else "carry_off"
            by_mode[key] = {
                "train_prompts": acceptance(target, drafter, train_prompts, args.max_new_tokens, use_carryover),
                "held_out_prompts": acceptance(target, drafter, held_out_prompts, args.max_new_tokens, use_carryover),
            }

    summary = {
        "target": args.target,
        "drafter_type": args.drafter_type,
        "block_size": args.block_size,
        "baseline_epochs": args.baseline_epochs,
        "extra_epochs": args.extra_epochs,
        "results": results,
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\nmean acceptance length per round (bonus included), {args.max_new_tokens} new tokens per prompt")
    print(f"{'drafter':<22}{'carry rows':<12}{'train prompts':>15}{'held-out':>12}")
    for name, modes in results.items():
        for key, value in modes.items():
            print(f"{name:<22}{key:<12}{value['train_prompts']['mean_acceptance_length']:>15.3f}"
                  f"{value['held_out_prompts']['mean_acceptance_length']:>12.3f}")  # fmt: skip
    print(f"\nwritten to {os.path.join(args.output_dir, 'results.json')}")


if __name__ == "__main__":
    main()
