"""Does training on new text only (`anchor_skip_repeated`) make a stronger drafter for decoding?

Two branches from a campaign milestone's weights, the same steps, batches, seed and schedule (a 10 % warm-up and a
cosine to 0, as the campaign's carry branches): `uniform` draws anchors from every response position (the trunk's
recipe), `new<N>` none where the last N tokens occurred earlier in the row (SmolLM2-135M's looping answers). Both are
then read by `walk_tau.py` on the held-out rows: decoding tau (first 128 tokens and whole responses) and tau at
repeated / new anchors.

    python experiments/smollm2_135m/anchor_branches.py --campaign ../runs/campaign --milestone 4 --steps 500 \
        --out ../runs/anchor-branches
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import carryover_hf  # noqa: F401
from carryover_hf.targets import load_target
from carryover_hf.tools.campaign import Campaign, _Trainers, train_store_names, training_arguments
from carryover_hf.training.feature_store import FeatureStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", default="../runs/campaign")
    parser.add_argument("--milestone", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--skip", type=int, default=8)
    parser.add_argument("--out", default="../runs/anchor-branches")
    args = parser.parse_args()
    campaign = Campaign(args.campaign)
    config = campaign.load_config()
    torch.set_num_threads(config.threads)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    train = FeatureStore([campaign.dir / name for name in train_store_names(len(config.datasets))])
    held_out = FeatureStore(campaign.dir / "features-eval")
    milestone = campaign.dir / "milestones" / f"m{args.milestone:02d}"
    trainers = _Trainers(config, target, tokenizer, train, held_out, campaign.dir / "trunk")
    out = Path(args.out)
    for name, skip in (("uniform", 0), (f"new{args.skip}", args.skip)):
        if (out / name / "branch.json").is_file():
            continue
        started = time.process_time()
        training = training_arguments(config, out / name / "run", max_steps=args.steps, learning_rate=args.learning_rate,
                                      lr_scheduler_type="cosine", warmup_steps=max(1, args.steps // 10),
                                      eval_strategy="no", save_strategy="no", anchor_skip_repeated=skip)  # fmt: skip
        trainer = trainers(training, [], weights=milestone)
        trainer.train()
        evaluation = trainer.evaluate()
        trainer.save_model(str(out / name))
        record = {"milestone": args.milestone, "steps": args.steps, "learning_rate": args.learning_rate,
                  "anchor_skip_repeated": skip, "core_hours": (time.process_time() - started) / 3600.0,
                  "eval_tau_teacher_forced": evaluation.get("eval_tau_teacher_forced"),
                  "eval_tau_decoding": evaluation.get("eval_tau_decoding"), "eval_loss": evaluation.get("eval_loss")}  # fmt: skip
        (out / name / "branch.json").write_text(json.dumps(record, indent=1) + "\n")
        print(name, record, flush=True)


if __name__ == "__main__":
    main()
