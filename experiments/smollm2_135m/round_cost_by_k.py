"""What a round of k drafts costs inside `generate`, against the target's calibrated verification curve (2026-12-07).

The cost policy's round choice is replaced by a fixed cycle over k = 0 (a plain step), 1, ..., block - 1, so that every
k is timed under the same conditions, interleaved; each round's seconds are what `MeasuredCost.record` sees (from one
round's plan to the next: the drafter's proposal, the verification and Transformers' bookkeeping). Greedy, carry off,
CPU kernels on, one thread. Output stays the target's own (every proposal is verified).

    python experiments/smollm2_135m/round_cost_by_k.py --drafter drafters/carryover-hf/smollm2-135m-campaign-markov \
        --prompts_per_category 1 --out ../runs/round-cost-by-k.json
"""
import argparse
import itertools
import json
import statistics

import torch

import carryover_hf  # noqa: F401
from carryover_hf import round_policy
from carryover_hf.generation import declare_generation_options
from carryover_hf.hub.loading import load_drafter
from carryover_hf.targets import load_target
from carryover_hf.tools.bench.prompts import encode_prompt, load_prompts
from carryover_hf.tools.cpu_kernels import apply_cpu_kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts_per_category", type=int, default=1)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer = load_target("smollm2-135m")
    drafter = load_drafter(args.drafter, target)
    apply_cpu_kernels(target, drafter)
    declare_generation_options(target)
    block = drafter.config.block_size
    cycle = itertools.cycle(range(block))
    samples: dict[int, list[float]] = {k: [] for k in range(block)}

    def fixed(estimates, available, cost, drafts_only=False, rate=None):
        k = min(next(cycle), available.get("draft", 0))
        return round_policy.Choice("draft" if k else None, k, 0.0)

    record = round_policy.MeasuredCost.record

    def timed(self, source, drafts, seconds):
        samples[drafts if source == "draft" else 0].append(seconds)
        return record(self, source, drafts, seconds)

    round_policy.best_proposal = fixed
    round_policy.MeasuredCost.record = timed
    prompts = load_prompts("assets/prompts", split="eval", num_per_category=args.prompts_per_category)
    for prompt in prompts:
        ids = encode_prompt(prompt, tokenizer)
        target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=False,
                        max_new_tokens=args.max_new_tokens, round_policy="cost", suffix_match=False,
                        use_carryover=False, verification_cost="measured")  # fmt: skip
    curve = round_policy.calibrate(target, max(block - 1, 16))
    plain = statistics.median(samples[0])
    rows = [{"drafts": k, "rounds": len(s), "median_ms": 1000 * statistics.median(s),
             "relative_to_plain": statistics.median(s) / plain, "calibrated_verification": curve.relative[k]}
            for k, s in samples.items()]  # fmt: skip
    json.dump({"drafter": args.drafter, "rows": rows}, open(args.out, "w"), indent=2)
    for row in rows:
        print(f"k={row['drafts']}  rounds {row['rounds']:4d}  median {row['median_ms']:6.1f} ms  "
              f"x plain {row['relative_to_plain']:.3f}  calibrated verification {row['calibrated_verification']:.3f}")


if __name__ == "__main__":
    main()
