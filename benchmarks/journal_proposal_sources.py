"""Where a method's rounds came from, per method of a journaled benchmark: plain steps, context lookups, drafter.

    python benchmarks/journal_proposal_sources.py benchmarks/results/smollm2-135m-0.2-head-t1 --block_size 4

A round with no draft is a plain target step; one with more drafts than the drafter's block allows
(`block_size - 1`) was a context lookup (`lookup_drafts` above `block_size - 1`, as in the 0.2 benchmarks); the rest
were drafter proposals (a lookup that found at most `block_size - 1` tokens counts as one too: the journal does not
record a round's source; every proposal of `prompt_lookup` is a lookup). For each kind: its share of rounds and the drafts the target accepted per round, pooled.

What each kind of round costs: the journal times whole generations, not rounds. A plain round is the target's 1-token
forward, so it is taken to cost one step of the target alone on the same prompt (the loop around it measured 0.3 %
of a step); the cost of a lookup and of a drafter round, in target steps, is fitted by least squares over prompts (a
prompt's decode time over the target alone's time per token, less its plain rounds, against its counts of the other
two kinds), with 95 % percentile bootstrap intervals over prompts. (Fitting the plain rounds' cost too is
ill-conditioned: in methods without backoff they are 1 % of rounds.) Tokens per step of cost (tokens a round returns,
bonus included, over its cost) says which rounds pay: a plain step returns 1 token per step; a kind below that would
be cheaper as plain steps. With a `draft_confidence_threshold`, a proposal cut to zero drafts counts as a plain round
although it ran the drafter's forward, and the fit charges that cost to the other kinds.
"""

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from carryover_hf.tools.bench.journal import read_journal

KINDS = ("plain", "lookup", "drafter")
PROPOSING = KINDS[1:]  # the kinds whose cost is fitted; a plain round costs one target step


def round_kind(method: str, drafts: int, block_size: int) -> str:
    if drafts == 0:
        return "plain"
    lookup = drafts > block_size - 1 or method == "prompt_lookup"  # prompt lookup only looks up
    return "lookup" if lookup else "drafter"


def fit_round_costs(rounds: np.ndarray, steps: np.ndarray, resamples: int = 2000, seed: int = 0) -> list[dict | None]:
    """Least-squares cost, in target steps, of each kind of round (columns of `rounds`, one row per prompt) that makes
    up `steps` (one value per prompt), with 95 % percentile bootstrap intervals over prompts; None for a kind no prompt
    had, or for all when there are fewer than two prompts per kind to fit."""
    used = [k for k in range(rounds.shape[1]) if rounds[:, k].any()]
    if len(rounds) < 2 * len(used):
        return [None] * rounds.shape[1]  # too few prompts to tell the kinds apart
    fit = lambda rows: np.linalg.lstsq(rounds[rows][:, used], steps[rows], rcond=None)[0]  # noqa: E731
    estimate = fit(np.arange(len(steps)))
    rng = np.random.default_rng(seed)
    draws = np.array([fit(rng.integers(0, len(steps), len(steps))) for _ in range(resamples)])
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    out: list[dict | None] = [None] * rounds.shape[1]
    for i, k in enumerate(used):
        out[k] = {"steps": float(estimate[i]), "interval": [float(low[i]), float(high[i])]}
    return out


def proposal_sources(journal: Path, block_size: int) -> dict[str, dict]:
    counts = defaultdict(Counter)
    per_prompt = defaultdict(list)  # method -> [(rounds of each kind), decode time in target steps]
    for group in read_journal(journal)[2]:
        target = next((r for r in group["runs"] if r["method"] == "target"), None)
        for run in group["runs"]:
            c, kinds = counts[run["method"]], Counter()
            for accepted, drafts in zip(run["acceptance_lengths"], run["draft_lengths"]):
                kind = round_kind(run["method"], drafts, block_size)
                kinds[kind] += 1
                c[kind] += 1
                c[f"{kind}_accepted"] += accepted - 1  # the bonus token is not a draft
                c[f"{kind}_drafts"] += drafts
            if target is not None and target["decode_tokens"] and target["decode_time"] > 0:
                steps = run["decode_time"] / (target["decode_time"] / target["decode_tokens"])
                # a plain round costs one step; the rest of the time is the proposing rounds'
                per_prompt[run["method"]].append(([kinds[k] for k in PROPOSING], steps - kinds["plain"]))
    out = {}
    for method, c in sorted(counts.items()):
        rounds = c["plain"] + c["lookup"] + c["drafter"]
        if not rounds or c["lookup"] + c["drafter"] == 0:
            continue  # the target alone, or a method that never proposed
        prompts = per_prompt[method]
        fitted = fit_round_costs(np.array([p[0] for p in prompts], float), np.array([p[1] for p in prompts]))
        costs = [{"steps": 1.0, "interval": None}, *fitted] if prompts else [None] * len(KINDS)
        table = {"rounds": rounds, "prompts": len(prompts)}
        for kind, cost in zip(KINDS, costs):
            tokens = (c[f"{kind}_accepted"] + c[kind]) / c[kind] if c[kind] else None  # drafts accepted + bonus
            table[kind] = {
                "share": c[kind] / rounds,
                "accepted_per_round": c[f"{kind}_accepted"] / c[kind] if c[kind] else None,
                "drafts_per_round": c[f"{kind}_drafts"] / c[kind] if c[kind] else None,
                "cost_in_target_steps": cost,
                "tokens_per_step_of_cost": tokens / cost["steps"] if cost and tokens and cost["steps"] > 0 else None,
            }
        out[method] = table
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
    print("\nCost of a round in target steps (a plain round: one step; the others: least squares over prompts, 95 % "
          "bootstrap interval) and the tokens it returns per step of cost (above 1: it pays against plain steps):\n")
    print("| method | prompts | " + " | ".join(f"{kind}: cost, tokens per step" for kind in PROPOSING) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in PROPOSING) + " |")
    for method, t in table.items():
        cells = []
        for kind in PROPOSING:
            cost, per_step = t[kind]["cost_in_target_steps"], t[kind]["tokens_per_step_of_cost"]
            cells.append("–" if cost is None else f"{cost['steps']:.2f} [{cost['interval'][0]:.2f}, "
                         f"{cost['interval'][1]:.2f}], " + ("–" if per_step is None else f"{per_step:.2f}"))
        print(f"| {method} | {t['prompts']} | " + " | ".join(cells) + " |")
    if args.output:
        args.output.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
