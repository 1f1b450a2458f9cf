"""A Markov drafter's proposal with its head term batched over the block rows, against the row-by-row head before it.

A Markov drafter drafts row by row: row j's logits are the target's LM head over the drafter's state of row j plus
the transition term of the draft of row j - 1. Until 2026-12-03 `drafter.propose` ran the head product one row at a
time too, so each proposal streamed the head's weight (8,192 x 576 float32 for the SmolLM2 drafters: 19 MB) once per
row; now the head term of all rows is one product (only the transition term goes row by row). Both are the same
`propose`: `HEAD_CHUNK_ELEMENTS = 1` gives back the row-by-row head exactly (one row per product).

Each timed proposal is one greedy round of `generate` (`carryover_hf.tools.bench.overhead.RecordedRound`: the round's new
context row, B-1 carry rows when the drafter carries, the greedy drafts) right after a target 1-token step on the same
context, as in generation; the two variants take turns going first, at each context length, in one process.

    python experiments/proposal_head_batching.py --threads 1 --output benchmarks/results/smollm2-135m-proposal-head-batching
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import carryover_hf
from carryover_hf import modeling_carryover
from carryover_hf.tools.bench.overhead import RecordedRound, record_features
from carryover_hf.tools.bench.prompts import encode_prompt, load_prompts
from carryover_hf.tools.bench.report import machine
from carryover_hf.tools.bench.stats import bootstrap_interval, ratio_of_sums
from carryover_hf.tools.cpu_kernels import apply_cpu_kernels
from carryover_hf.targets import load_target

VARIANTS = {"row_by_row": 1, "batched": modeling_carryover.HEAD_CHUNK_ELEMENTS}  # HEAD_CHUNK_ELEMENTS of each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default="drafters/carryover-hf/smollm2-135m-carryover-markov")
    parser.add_argument("--context_lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, required=True, help="folder for results.json and results.md")
    args = parser.parse_args()
    if not (Path(args.drafter) / "config.json").is_file():
        raise SystemExit(f"--drafter {args.drafter} is not a saved drafter folder (no config.json)")
    if args.repeats < 2 or min(args.context_lengths) < 2:
        raise SystemExit("--repeats must be at least 2 and every context length at least 2")
    torch.set_num_threads(args.threads)

    target, tokenizer = load_target(args.target)
    drafter = carryover_hf.CarryoverDrafterModel.from_pretrained(args.drafter, dtype=target.dtype).eval()
    if drafter.markov_head is None:
        raise SystemExit(f"{args.drafter} has no Markov head: its greedy proposal already takes every row at once")
    kernels = apply_cpu_kernels(target, drafter)
    # The recorded context: the held-out prompts joined (the timing does not depend on which tokens they are).
    stream = torch.cat([encode_prompt(p, tokenizer)[0] for p in load_prompts("assets/prompts", split="eval")])
    needed = max(args.context_lengths) + drafter.config.block_size - 1
    if stream.numel() < needed:
        raise SystemExit(f"the eval prompts hold {stream.numel()} tokens; context length {max(args.context_lengths)} needs {needed}")
    ids, features = record_features(target, drafter, stream[:needed].unsqueeze(0))
    head = drafter.draft_head(target.get_output_embeddings())

    rows = []
    with torch.no_grad():
        for length in args.context_lengths:
            round_ = RecordedRound(target, drafter, head, ids, features, length, new_context_rows=1)
            times = {name: [] for name in VARIANTS}
            steps = []
            for step in tqdm(range(args.warmup + args.repeats), desc=f"L={length}"):
                for name in VARIANTS if step % 2 == 0 else reversed(VARIANTS):
                    modeling_carryover.HEAD_CHUNK_ELEMENTS = VARIANTS[name]
                    step_ms, proposal_ms = round_.time(with_carry=drafter.generation_config.use_carryover)
                    if step >= args.warmup:
                        times[name].append(proposal_ms)
                        steps.append(step_ms)
            round_.check()
            before, after = np.array(times["row_by_row"]), np.array(times["batched"])
            ratio = bootstrap_interval([after, before], ratio_of_sums)  # paired, equal lengths: the ratio of means
            rows.append({
                "context_length": length,
                "median_ms_row_by_row": float(np.median(before)),
                "median_ms_batched": float(np.median(after)),
                "mean_ms_row_by_row": float(before.mean()),
                "mean_ms_batched": float(after.mean()),
                "batched_over_row_by_row": ratio.to_dict(),
                "median_target_step_ms": float(np.median(steps)),
                "times_ms_row_by_row": before.tolist(),
                "times_ms_batched": after.tolist(),
                "times_ms_target_step": steps,
            })  # fmt: skip
    modeling_carryover.HEAD_CHUNK_ELEMENTS = VARIANTS["batched"]

    result = {
        "drafter": args.drafter,
        "carry_rows": drafter.config.block_size - 1 if drafter.generation_config.use_carryover else 0,
        "threads": args.threads,
        "cpu_kernels": kernels,
        "machine": machine(target.device),
        "command": "python experiments/proposal_head_batching.py " + " ".join(
            f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()
        ),
        "by_context_length": rows,
    }  # fmt: skip
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    lines = [
        "# A Markov drafter's proposal: head batched over the block rows vs row by row",
        "",
        f"`{result['command']}` on {result['machine']}. Each proposal (new context row, "
        f"{result['carry_rows']} carry rows, greedy drafts) right after a target 1-token step; medians of "
        f"{args.repeats} per variant; the ratio is of means, with its 95 % bootstrap interval.",
        "",
        "| context | row by row ms | batched ms | batched / row by row | target step ms | proposal / step, before -> after |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r, step = row["batched_over_row_by_row"], row["median_target_step_ms"]
        lines.append(
            f"| {row['context_length']} | {row['median_ms_row_by_row']:.2f} | {row['median_ms_batched']:.2f} | "
            f"{r['estimate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {step:.1f} | "
            f"{row['median_ms_row_by_row'] / step:.3f} -> {row['median_ms_batched'] / step:.3f} |"
        )
    (args.output / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
