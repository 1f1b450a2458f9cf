"""Branches of the campaign's trunk that differ in one setting, against the trunk's recipe, from one checkpoint.

Each branch continues the same trunk checkpoint for the same steps on the same batches and seed, with the campaign's
learning rate, a 10 % warm-up and a cosine to 0 (a milestone's decay), and is evaluated on the held-out rows at its
end (loss, tau teacher-forced and as decoding sees it) with its training core-hours. Branches, by name:

* `l1`: the trunk's recipe as it is (the baseline: what a decay alone gives);
* `l<N>`: the drafter grown to N layers by `carryover_hf.training.initialization.grow_layers` (the new layers copies
  of the target's last layer with their output projections zeroed: the grown drafter computes exactly what the
  trained one did at step 0, so any difference is learned capacity);
* `gamma<G>`: position weights `exp(-(j - 1) / G)` in the loss (`loss_decay_gamma`; the campaign's block 8 uses 4);
* `new<N>`: no training anchor where the last N tokens occurred earlier in the row (`anchor_skip_repeated`);
* `tv<W>` / `kl<W>`: the distillation term as `(1 - W) CE + W D` with D total variation or KL to the target's stored
  top-k (`distillation`, `distillation_weight`; the campaign's is `kl0.5`). Acceptance at T = 1 is `1 - TV(p, q)` a
  position, which `tv` trains directly.

2026-12-07, from trunk checkpoint 15,600 (results: benchmarks/results/smollm2-135m-depth-branches/):

    cp -r ../runs/campaign/trunk/checkpoint-15600 ../runs/depth-branches/start
    python experiments/smollm2_135m/trunk_branches.py --weights ../runs/depth-branches/start --steps 1200 \
        --branch l1 --branch l2 --out ../runs/depth-branches
    python experiments/smollm2_135m/trunk_branches.py --weights ../runs/depth-branches/start --steps 1200 \
        --rows 10054 --branch gamma1.5 --out ../runs/depth-branches

The anchor experiment (results: benchmarks/results/smollm2-135m-anchor-skip-repeated-m4/) ran as
`anchor_branches.py` (git history), its baseline named `uniform`; here it is

    python experiments/smollm2_135m/trunk_branches.py --weights ../runs/campaign/milestones/m04 --steps 500 \
        --learning_rate 3e-4 --branch l1 --branch new8 --out ../runs/anchor-branches

`--rows` keeps the training rows to the first N: the campaign was still encoding new rows when `l1` ran, and it saw
10,054 (what its logged epochs give); a later branch compared with it must read the same.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import carryover_hf  # noqa: F401
from carryover_hf.modeling_carryover import CarryoverDrafterModel
from carryover_hf.targets import load_target
from carryover_hf.tools.campaign import Campaign, _Trainers, train_store_names, training_arguments
from carryover_hf.training.feature_store import FeatureStore
from carryover_hf.training.initialization import grow_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", default="../runs/campaign")
    parser.add_argument("--weights", required=True, help="a saved drafter folder (a copied trunk checkpoint)")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--learning_rate", type=float, default=None, help="default: the campaign's")
    parser.add_argument("--branch", action="append", required=True, help="l1, l<N>, gamma<G>, new<N>, tv<W> or kl<W> (repeatable)")
    parser.add_argument("--rows", type=int, default=None, help="train on the first N rows only")
    parser.add_argument("--out", default="../runs/depth-branches")
    args = parser.parse_args()
    campaign = Campaign(args.campaign)
    config = campaign.load_config()
    torch.set_num_threads(config.threads)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    # The rows written when the script starts (the campaign may still be encoding new ones): both branches read the same.
    train = FeatureStore([campaign.dir / name for name in train_store_names(len(config.datasets))], allow_incomplete=True)
    train = train.head(args.rows) if args.rows else train
    held_out = FeatureStore(campaign.dir / "features-eval")
    trainers = _Trainers(config, target, tokenizer, train, held_out, campaign.dir / "trunk")
    learning_rate = args.learning_rate or config.learning_rate
    out = Path(args.out)
    for name in args.branch:
        if (out / name / "branch.json").is_file():
            continue
        layers = int(name[1:]) if name.startswith("l") else config.drafter_layers
        overrides = {"loss_decay_gamma": float(name[len("gamma"):])} if name.startswith("gamma") else {}
        overrides = {"anchor_skip_repeated": int(name[len("new"):])} if name.startswith("new") else overrides
        if name.startswith(("tv", "kl")):
            overrides = {"distillation": name[:2], "distillation_weight": float(name[2:])}
        started = time.process_time()
        training = training_arguments(config, out / name / "run", max_steps=args.steps, learning_rate=learning_rate,
                                      lr_scheduler_type="cosine", warmup_steps=max(1, args.steps // 10),
                                      eval_strategy="no", save_strategy="no", **overrides)  # fmt: skip
        start = Path(args.weights)
        if layers > config.drafter_layers:
            start = out / f"start-{name}"
            drafter = CarryoverDrafterModel.from_pretrained(args.weights, dtype=torch.float32)
            grow_layers(drafter, target, layers).save_pretrained(start)
        trainer = trainers(training, [], weights=start)
        trainer.train()
        evaluation = trainer.evaluate()
        trainer.save_model(str(out / name))
        record = {"weights": args.weights, "layers": layers, **overrides, "steps": args.steps, "rows": len(train),
                  "learning_rate": learning_rate,
                  "core_hours": (time.process_time() - started) / 3600.0,
                  "eval_tau_teacher_forced": evaluation.get("eval_tau_teacher_forced"),
                  "eval_tau_decoding": evaluation.get("eval_tau_decoding"),
                  "eval_tau_t1_teacher_forced": evaluation.get("eval_tau_t1_teacher_forced"),
                  "eval_acceptance_t1_pos_01": evaluation.get("eval_acceptance_t1_pos_01"),
                  "eval_loss": evaluation.get("eval_loss")}  # fmt: skip
        (out / name / "branch.json").write_text(json.dumps(record, indent=1) + "\n")
        print(name, record, flush=True)


if __name__ == "__main__":
    main()
