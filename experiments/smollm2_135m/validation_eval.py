"""Drafter folders measured on the campaign's validation set, per category.

The validation set (`assets/train/smollm2-135m-validation`: the target's greedy responses, 128 tokens, to prompts
20-39 of each eval-split category) is encoded by the campaign into `features-validation/`. For each drafter folder
this prints and writes, in one process and thread:

* the decoding τ of full-block greedy decoding replayed on the rows (`carryover_hf.training.replay`), pooled and per
  category, and its mean over categories;
* the teacher-forced τ, the expected τ of sampled drafts at T = 1 and the loss (the campaign's evaluation).

    python experiments/smollm2_135m/validation_eval.py --campaign ../runs/campaign \
        --drafter m4=../runs/campaign/milestones/m04 --drafter m5=../runs/campaign/milestones/m05 --out results.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

import carryover_hf  # noqa: F401  (registers the drafter)
from carryover_hf.targets import load_target
from carryover_hf.tools.campaign import VALIDATION, Campaign, _Trainers, train_store_names, training_arguments
from carryover_hf.training.data import load_rows
from carryover_hf.training.feature_store import FeatureStore
from carryover_hf.training.replay import anchor_acceptance, replay_rounds
from carryover_hf.training.arguments import DECODING_MAX_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", default="../runs/campaign")
    parser.add_argument("--drafter", action="append", required=True, help="NAME=FOLDER (repeatable)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    drafters = dict(item.split("=", 1) for item in args.drafter)

    campaign = Campaign(args.campaign)
    config = campaign.load_config()
    if not config.validation_dataset:
        raise SystemExit(f"{campaign.dir} has no validation_dataset.")
    torch.set_num_threads(1)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    store = FeatureStore(campaign.dir / f"features-{VALIDATION}")
    categories = load_rows(config.validation_dataset, "validation_dataset")["category"]
    if len(categories) != len(store):
        raise SystemExit(f"the store holds {len(store)} rows, the dataset {len(categories)}: restart the campaign.")
    train = FeatureStore([campaign.dir / n for n in train_store_names(len(config.datasets))]).head(8)
    trainers = _Trainers(config, target, tokenizer, train, store, campaign.dir / "trunk")
    results = {}
    for name, folder in drafters.items():
        training = training_arguments(config, Path("/tmp/validation_eval"), max_steps=1, eval_strategy="no",
                                      save_strategy="no", eval_decoding_tau=False)  # fmt: skip
        trainer = trainers(training, [], weights=Path(folder))
        metrics = trainer.evaluate()
        drafter = trainer.model.eval()
        totals = defaultdict(lambda: [0, 0])
        for index in range(len(store)):
            row = store[index]
            tau = anchor_acceptance(trainer.drafter_objective, drafter, row, DECODING_MAX_TOKENS)
            rounds = replay_rounds(tau.tolist(), row["loss_mask"].tolist(), DECODING_MAX_TOKENS)
            for key in (categories[index], "all"):
                totals[key][0] += sum(rounds)
                totals[key][1] += len(rounds)
        per_category = {c: t / r for c, (t, r) in sorted(totals.items()) if c != "all"}
        results[name] = {
            "folder": str(folder), "tau_decoding": totals["all"][0] / totals["all"][1],
            "tau_decoding_category_mean": sum(per_category.values()) / len(per_category),
            "tau_decoding_by_category": per_category, "tau_teacher_forced": metrics.get("eval_tau_teacher_forced"),
            "tau_t1_teacher_forced": metrics.get("eval_tau_t1_teacher_forced"), "loss": metrics.get("eval_loss"),
        }  # fmt: skip
        print(name, json.dumps(results[name]), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
