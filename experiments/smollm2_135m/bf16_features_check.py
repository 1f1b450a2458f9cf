"""Do features built by the target in bfloat16 read the same to a trained drafter as float32 ones?

Builds the feature store of one dataset twice (target in float32, target in bfloat16; both stored in the campaign's
storage dtype), then evaluates one drafter on each with the campaign's held-out metrics (teacher-forced tau, decoding
tau, expected tau at T = 1, loss). Equal metrics mean the drafter cannot tell the stores apart, so training on the
faster bfloat16 build (`feature_target_dtype: auto`) trains for the same inputs it meets at inference (float32).

    python experiments/smollm2_135m/bf16_features_check.py --drafter assets/training-state/smollm2-135m-markov-b8 \
        --dataset assets/train/smollm2-135m-validation --out ../runs/bf16-check
"""

import argparse
import json
import time
from pathlib import Path

import torch

from carryover_hf.modeling_carryover import CarryoverDrafterModel
from carryover_hf.targets import load_target
from carryover_hf.tools.campaign import CampaignConfig, training_arguments
from carryover_hf.training.data import load_rows
from carryover_hf.training.feature_store import FeatureBuildConfig, FeatureStore, build_features
from carryover_hf.training.trainer import CarryoverTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--campaign", default="assets/campaigns/smollm2-135m-markov-b8.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = CampaignConfig.from_dict(json.loads(Path(args.campaign).read_text()))
    out = Path(args.out)
    rows = load_rows(args.dataset, "dataset")
    target, tokenizer = load_target(config.target, dtype="float32")
    results = {"dataset": args.dataset, "rows": len(rows), "drafter": args.drafter, "threads": args.threads, "runs": {}}
    for dtype in ("float32", "bfloat16"):
        builder = target if dtype == "float32" else load_target(config.target, dtype=dtype)[0]
        build = FeatureBuildConfig(output=str(out / f"features-{dtype}"), target=config.target,
                                   target_layer_ids=config.target_layer_ids, dtype=config.feature_dtype,
                                   top_k=config.top_k, shard_rows=config.feature_shard_rows,
                                   batch_size=config.feature_batch_size, num_threads=args.threads)
        started = time.perf_counter()
        manifest = build_features(build, target=builder, rows=rows, progress=False)
        seconds = time.perf_counter() - started
        store = FeatureStore(out / f"features-{dtype}")
        drafter = CarryoverDrafterModel.from_pretrained(args.drafter, dtype=torch.float32)
        trainer = CarryoverTrainer(model=drafter, target_model=target, processing_class=tokenizer,
                                   args=training_arguments(config, out / "eval"), train_dataset=store, eval_dataset=store)
        metrics = trainer.evaluate(store)
        results["runs"][dtype] = {"build_seconds": round(seconds, 1), "tokens": manifest["summary"]["tokens"],
                                  **{k: round(v, 4) for k, v in metrics.items() if k.startswith("eval_")}}
        print(dtype, results["runs"][dtype], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
