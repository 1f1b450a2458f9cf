"""Does the drafter train as well, and faster, under bfloat16 autocast on a CPU that computes bfloat16 natively?

From one checkpoint of a campaign's trunk, two branches of the same steps on the same batches and anchors (same
seed): float32, and bfloat16 autocast (`cpu_autocast="bfloat16"`: float32 weights and optimizer, the training steps'
forward and loss under `torch.autocast`). Each
reports its CPU seconds a step and its validation metrics after the steps (teacher-forced τ, decoding τ, τ at T = 1,
loss), evaluated in float32 (the autocast covers training steps only) so that only the training differs.

    python experiments/smollm2_135m/bf16_training_check.py --campaign ../runs/campaign --steps 200 \
        --out ../runs/bf16-training
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from carryover_hf.targets import load_target
from carryover_hf.tools.campaign import VALIDATION, Campaign, _Trainers, train_store_names, training_arguments
from carryover_hf.training.feature_store import FeatureStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = Campaign(args.campaign)
    config = campaign.load_config()
    out = Path(args.out)
    start = out / "start"  # a copy: the trunk goes on and removes its older checkpoints meanwhile
    start.mkdir(parents=True, exist_ok=True)
    source = campaign.last_checkpoint()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(Path(source) / name, start / name)
    target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    train = FeatureStore([campaign.dir / n for n in train_store_names(len(config.datasets))], allow_incomplete=True)
    validation = FeatureStore(campaign.dir / f"features-{VALIDATION}")
    trainers = _Trainers(config, target, tokenizer, train, FeatureStore(campaign.dir / "features-eval"), out)
    results = {"start": source, "steps": args.steps, "train_rows": len(train), "threads": args.threads, "runs": {}}
    for name, bf16 in (("float32", False), ("bfloat16-autocast", True)):
        arguments = training_arguments(config, out / name, max_steps=args.steps, eval_strategy="no",
                                       save_strategy="no", logging_steps=50, cpu_autocast="bfloat16" if bf16 else None)
        trainer = trainers(arguments, [], weights=start)
        started = time.process_time()
        trainer.train()
        seconds = time.process_time() - started
        metrics = trainer.evaluate(validation, metric_key_prefix=f"eval_{VALIDATION}")
        results["runs"][name] = {"cpu_seconds_per_step": round(seconds / args.steps, 3),
                                 "final_train_loss": trainer.state.log_history[-2].get("loss"),
                                 **{k: round(v, 4) for k, v in metrics.items() if "tau" in k or k.endswith("loss")}}
        print(name, results["runs"][name], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
