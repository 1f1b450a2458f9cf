"""Teacher-forced tau at uniform anchors against tau of replayed greedy decoding (`carryover_hf.training.replay`),
on held-out feature rows, split by whether the anchor's last 8 tokens occurred earlier in the row (repeated text,
which a suffix lookup drafts for free) or not.

    python experiments/smollm2_135m/walk_tau.py --drafter ../runs/campaign/milestones/m04 \
        --features ../runs/campaign/features-eval --out benchmarks/results/walk-tau-m04.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import carryover_hf  # noqa: F401
from carryover_hf.modeling_carryover import CarryoverDrafterModel
from carryover_hf.targets import load_target
from carryover_hf.training.collator import repeated_positions, valid_anchor_positions
from carryover_hf.training.feature_store import FeatureStore
from carryover_hf.training.objectives import DrafterObjective
from carryover_hf.training.replay import anchor_acceptance, replay_rounds

REPEAT_NGRAM = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, _ = load_target("smollm2-135m", dtype=torch.float32)
    drafter = CarryoverDrafterModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    objective = DrafterObjective(target)
    store = FeatureStore(args.features)
    anchors = {"repeated": [], "new": []}
    rounds = {"whole": [], "first128": []}
    for i in range(len(store)):
        row = store[i]
        tau = anchor_acceptance(objective, drafter, row).tolist()
        mask = row["loss_mask"].tolist()
        flags = repeated_positions(row["input_ids"].tolist(), REPEAT_NGRAM)
        for a in valid_anchor_positions(mask):
            anchors["repeated" if flags[a] else "new"].append(tau[a])
        rounds["whole"] += replay_rounds(tau, mask)
        rounds["first128"] += replay_rounds(tau, mask, 128)
    every = anchors["repeated"] + anchors["new"]
    result = {
        "drafter": args.drafter, "features": args.features, "rows": len(store),
        "uniform_anchor_tau": sum(every) / len(every), "anchors": len(every),
        **{f"{k}_anchor_tau": sum(v) / len(v) for k, v in anchors.items()},
        **{f"{k}_anchors": len(v) for k, v in anchors.items()},
        **{f"decoding_tau_{k}": sum(v) / len(v) for k, v in rounds.items()},
        **{f"rounds_{k}": len(v) for k, v in rounds.items()},
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
