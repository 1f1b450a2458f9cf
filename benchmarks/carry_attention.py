"""Do trained drafters read the carry rows? The block queries' attention on context, carry and block rows.

For each drafter, greedy generation with carry on (every round a drafter proposal: rules policy, no lookup, no
backoff) on held-out prompts of the eval split, with `carryover_hf.tools.carry_probe` recording the attention of every
proposal and layer. Writes `<output>/carry_attention.json` (settings, command, per-drafter shares overall and per
layer) and `carry_attention.md` (a table).

    python benchmarks/carry_attention.py --drafters carryover=drafters/carryover-hf/smollm2-135m-carryover-markov \
        continued=drafters/carryover-hf/smollm2-135m-continued-markov --prompts_per_category 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import carryover_hf  # noqa: F401  (registers the drafter)
from carryover_hf.modeling_carryover import CarryoverDrafterModel
from carryover_hf.targets import load_target
from carryover_hf.tools.bench.prompts import default_suite_dir, encode_prompt, load_prompts
from carryover_hf.tools.carry_probe import attention_shares

OUTPUT = Path(__file__).resolve().parent / "results" / "carry-attention"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", nargs="+", required=True, help="name=folder of each drafter")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", default=None, help="a suite folder or JSONL (default: the shipped suites)")
    parser.add_argument("--prompts_per_category", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    specs = dict(spec.split("=", 1) for spec in args.drafters)
    missing = [folder for folder in specs.values() if not (Path(folder) / "config.json").is_file()]
    if missing:
        raise SystemExit(f"no drafter config in {missing}")
    target, tokenizer = load_target(args.target, dtype="float32")
    prompts = load_prompts(args.prompts or str(default_suite_dir()), split="eval", num_per_category=args.prompts_per_category)
    encoded = [encode_prompt(p, tokenizer) for p in prompts]
    results = {}
    for name, folder in specs.items():
        started = time.perf_counter()
        drafter = CarryoverDrafterModel.from_pretrained(folder, dtype=torch.float32).eval()
        results[name] = {"folder": folder, "trained_with_carryover": drafter.config.trained_with_carryover,
                         **attention_shares(target, drafter, encoded, args.max_new_tokens),
                         "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        print(name, {k: v for k, v in results[name].items() if k != "layers"}, flush=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": "python " + " ".join(sys.argv), "target": args.target, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "drafters": results}  # fmt: skip
    (out / "carry_attention.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| drafter | trained with carryover | proposals with carry | mean carry rows | context share | "
             "carry share | block share | carry row / context row | carry / as many latest context rows |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['trained_with_carryover']} | {r['proposals_with_carry']} of {r['proposals']} | "
                     f"{r['mean_carry_rows']:.2f} | {r['context_share']:.3f} | {r['carry_share']:.3f} | "
                     f"{r['block_share']:.3f} | {r['carry_per_row']:.2f} | {r['carry_over_recent_context']:.2f} |")  # fmt: skip
    (out / "carry_attention.md").write_text(f"`{record['command']}`\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
