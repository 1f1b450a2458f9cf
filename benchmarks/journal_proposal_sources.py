"""Where a method's rounds came from, per method of a journaled benchmark: plain steps, context lookups, drafter.

    python benchmarks/journal_proposal_sources.py benchmarks/results/smollm2-135m-0.2-backoff-t1 --block_size 4

A round with no draft is a plain target step; one with more drafts than the drafter's block allows
(`block_size - 1`) was a context lookup (`lookup_drafts` above `block_size - 1`, as in the 0.2 benchmarks); the rest
were drafter proposals (a lookup that found at most `block_size - 1` tokens counts as one too: the journal does not
record a round's source; every proposal of `prompt_lookup` is a lookup). For each kind: its share of rounds and the drafts the target accepted per round, pooled.
"""

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from carryover_hf.bench.journal import read_journal


def proposal_sources(journal: Path, block_size: int) -> dict[str, dict]:
    counts = defaultdict(Counter)
    for group in read_journal(journal)[2]:
        for run in group["runs"]:
            for accepted, drafts in zip(run["acceptance_lengths"], run["draft_lengths"]):
                lookup = drafts > block_size - 1 or run["method"] == "prompt_lookup"  # prompt lookup only looks up
                kind = "plain" if drafts == 0 else "lookup" if lookup else "drafter"
                c = counts[run["method"]]
                c[kind] += 1
                c[f"{kind}_accepted"] += accepted - 1  # the bonus token is not a draft
                c[f"{kind}_drafts"] += drafts
    out = {}
    for method, c in sorted(counts.items()):
        rounds = c["plain"] + c["lookup"] + c["drafter"]
        if not rounds or c["lookup"] + c["drafter"] == 0:
            continue  # the target alone, or a method that never proposed
        out[method] = {"rounds": rounds, **{
            kind: {"share": c[kind] / rounds,
                   "accepted_per_round": c[f"{kind}_accepted"] / c[kind] if c[kind] else None,
                   "drafts_per_round": c[f"{kind}_drafts"] / c[kind] if c[kind] else None}
            for kind in ("plain", "lookup", "drafter")
        }}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a benchmark output folder (with runs.jsonl) or the journal itself")
    parser.add_argument("--block_size", type=int, required=True, help="the drafter's block size")
    parser.add_argument("--output", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    journal = args.run / "runs.jsonl" if args.run.is_dir() else args.run
    if not journal.is_file():
        raise SystemExit(f"{journal} is not a file: give a benchmark output folder with a runs.jsonl journal.")
    if args.block_size < 2:
        raise SystemExit(f"--block_size must be at least 2 (a block holds the anchor and its drafts), got {args.block_size}")
    table = proposal_sources(journal, args.block_size)
    print("| method | rounds | plain | lookup: share, accepted of drafts | drafter: share, accepted of drafts |")
    print("| --- | --- | --- | --- | --- |")
    for method, t in table.items():
        cells = [f"{t['plain']['share']:.0%}"]
        for kind in ("lookup", "drafter"):
            k = t[kind]
            cells.append("–" if k["accepted_per_round"] is None
                         else f"{k['share']:.0%}, {k['accepted_per_round']:.2f} of {k['drafts_per_round']:.1f}")
        print(f"| {method} | {t['rounds']} | " + " | ".join(cells) + " |")
    if args.output:
        args.output.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
