"""Where a drafter proposal's time goes inside generation: the drafter's block forward and the draft head.

Both are timed inside real `generate` calls (greedy, no lookup, no backoff, so every round is a drafter proposal),
where the target's forward between proposals has evicted the drafter's weights from the caches: timing them in
isolation, on warm caches, understates them by about half. Packed linears are on for target and drafter; the draft
head's product alternates between `F.linear` (MKL) and the packed kernel (`DraftHead.linear`), one prompt at a time,
in one process.

    python benchmarks/proposal_breakdown.py --drafter assets/training-state/smollm2-135m-dflash-b4-baseline \
        --threads 1 --output benchmarks/results/smollm2-135m-proposal-breakdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModel

import carryover_hf  # noqa: F401  (registers the drafter classes, installs the generation hook)
from carryover_hf.tools.cpu_kernels import pack_linears, packed_linears_available
from carryover_hf.generation import RoundObserver, declare_generation_options, observing_rounds
from carryover_hf.targets import load_target

PROMPTS = [
    "Explain how a hash map works, with an example in Python.",
    "Translate into French: The weather was cold, so we stayed inside and read books all afternoon.",
    "A train leaves at 3 pm and travels 120 km at 80 km/h. When does it arrive? Explain step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
]


class ProposalTimer(RoundObserver):
    """Times each `get_candidates` call (`proposal`), each proposal's drafter forward (`block_forward`) and its
    draft picking (`head`) into `times[head]`; the `"default"` head gets MKL's product instead of the packed one."""

    def __init__(self):
        self.times = {head: defaultdict(list) for head in ("default", "packed")}
        self.head = "packed"
        self.marks: dict[str, float] = {}

    def _record(self, name: str, since: str) -> None:
        now = time.perf_counter()
        self.times[self.head][name].append(now - self.marks[since])
        self.marks[name] = now

    def generation_started(self, generator):
        if self.head == "default":
            generator.proposer.draft_head.linear = None

    def round_started(self, input_ids):
        self.marks["round"] = time.perf_counter()

    def proposal_started(self):
        self.marks["start"] = time.perf_counter()

    def forward_finished(self):
        self._record("block_forward", since="start")

    def proposal_finished(self):
        self._record("head", since="block_forward")

    def round_finished(self, input_ids, candidate_ids, candidate_logits):
        self._record("proposal", since="round")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", required=True, help="folder of a saved drafter")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the prompts, each with both heads")
    parser.add_argument("--output", type=Path, required=True, help="folder for results.json and results.md")
    args = parser.parse_args()
    if not packed_linears_available():
        raise SystemExit("this PyTorch build has no oneDNN packed linear")
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, dtype="float32")
    drafter = AutoModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    pack_linears(target)
    pack_linears(drafter)
    declare_generation_options(target)
    every_round_drafts = dict(lookup_drafts=0, proposal_backoff=0, draft_confidence_threshold=0.0)

    timer = ProposalTimer()
    times = timer.times
    with observing_rounds(drafter, timer):
        for round_ in range(args.rounds):
            for prompt in PROMPTS:
                for head in ("default", "packed") if round_ % 2 == 0 else ("packed", "default"):
                    timer.head = head
                    ids = tokenizer.apply_chat_template(
                        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
                    )
                    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                    target.generate(
                        ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False,
                        **every_round_drafts,
                    )

    summary = {
        head: {name: 1e3 * statistics.median(values) for name, values in store.items()} for head, store in times.items()
    }
    results = {
        "command": "python benchmarks/proposal_breakdown.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "threads": args.threads,
        "torch": torch.__version__,
        "draft_vocabulary": None if drafter.draft_token_ids is None else int(drafter.draft_token_ids.numel()),
        "block_size": drafter.config.block_size,
        "median_ms": summary,
        "calls": {head: {name: len(values) for name, values in store.items()} for head, store in times.items()},
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# A drafter proposal inside generation: block forward and draft head",
        "",
        f"`{results['command']}`",
        "",
        f"{args.threads} thread(s), torch {torch.__version__}, block {drafter.config.block_size}, draft vocabulary "
        f"{results['draft_vocabulary'] or 'full'}; medians per proposal over {len(PROMPTS)} prompts x {args.rounds} "
        "rounds, the two heads alternating. `proposal` is the whole `get_candidates` call.",
        "",
        "| draft head | proposal ms | block forward ms | head (pick drafts) ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for head, values in summary.items():
        lines.append(f"| {head} | {values['proposal']:.2f} | {values['block_forward']:.2f} | {values['head']:.2f} |")
    (args.output / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
