"""One proposal before and after issue 13, against the target's 1-token step, interleaved in one loop.

The drafter code of an earlier commit (`--before-commit`, default 2d0bccf: DynamicCache context, per-round block
embeddings / positions / rotary, three K/V concatenations per layer) is loaded next to the current one (same weights),
and one loop alternates, at every step and in rotating order:

* before: what the old generator did per round (block ids -> embedding, positions, drafter forward on a DynamicCache,
  LM head + argmax), with and without B-1 carry rows;
* after: what the current generator does (row 0 of the preallocated block embeddings, position slices, drafter
  forward on the DrafterContextBuffer, `drafter.propose`), with and without carry rows;
* the target's 1-token step (one forward over one token on the L-token cache, LM head included);
* the LM head alone with argmax over the B-1 proposal rows, and over one row (what the target step spends on it).

Each step is a round at the shipped drafter's typical acceptance (one accepted token: one new context row per round,
so the context grows as in generation). Machine load varies on shared machines; interleaving at this granularity
keeps the ratios comparable.

    python experiments/proposal_before_after.py --threads 1 --output benchmarks/results/smollm2-135m-round-profile/proposal_before_after.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

import carryover_hf
from carryover_hf import CarryoverDrafterModel
from carryover_hf.features import embed_block_tokens, gather_target_features, hidden_state_indices
from carryover_hf.modeling_carryover import DrafterContextBuffer
from carryover_hf.resources import PROMPT_SUITES_DIR
from carryover_hf.targets import load_target

ROOT = Path(__file__).resolve().parents[1]
OLD_FILES = ("configuration_carryover.py", "modeling_carryover.py")


def load_old_drafter_class(commit: str, folder: Path):
    package = folder / "carryover_hf_before"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in OLD_FILES:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:src/carryover_hf/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (package / name).write_text(text)
    sys.path.insert(0, str(folder))
    return importlib.import_module("carryover_hf_before.modeling_carryover").CarryoverDrafterModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", default="drafters/carryover-hf/smollm2-135m-carryover-dflash")
    parser.add_argument("--before-commit", default="2d0bccf")
    parser.add_argument("--context-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft-vocab-size", type=int, default=None,
                        help="give the 'after' drafter a draft vocabulary of this many ids (most frequent response "
                        "tokens of the committed training set first); its head then runs over those rows only")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, tokenizer = load_target("smollm2-135m", dtype="float32")
    new = CarryoverDrafterModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory() as folder:
        Old = load_old_drafter_class(args.before_commit, Path(folder))
        old = Old.from_pretrained(args.drafter, dtype=torch.float32).eval()
    if args.draft_vocab_size:
        from carryover_hf.tools.data import load_regenerated
        from carryover_hf.training.vocabulary import draft_vocabulary, response_token_counts

        counts = response_token_counts(load_regenerated(ROOT / "assets/train/smollm2-135m"), new.config.vocab_size)
        new.set_draft_vocabulary(draft_vocabulary(counts, args.draft_vocab_size))
    config = new.config
    block = config.block_size
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    head = new.draft_head(lm_head)
    prompts = [json.loads(line) for line in (PROMPT_SUITES_DIR / "eval/writing.jsonl").read_text().splitlines()[:8]]
    text = " ".join(p["turns"][0] for p in prompts) * 20
    needed = max(args.context_lengths) + args.warmup + args.repeats + 2 * block
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :needed]
    assert ids.shape[1] == needed, "not enough prompt text for the longest context"

    results = []
    with torch.no_grad():
        outputs = target(ids, output_hidden_states=hidden_state_indices(config.target_layer_ids))
        features = gather_target_features(outputs.hidden_states, config.target_layer_ids)
        del outputs
        for length in args.context_lengths:
            # Both drafters start from the same L-row context; the target from an L-token cache.
            old_cache = DynamicCache(config=config)
            new_cache = DrafterContextBuffer(new, max_positions=needed)
            warm = dict(block_embeds=embed(ids[:, :1]), block_position_ids=torch.tensor([[length - 1]]),
                        context_features=features[:, :length], context_position_ids=torch.arange(length)[None],
                        use_cache=True)
            old(**warm, past_key_values=old_cache)
            new(**warm, past_key_values=new_cache)
            target_cache = DynamicCache(config=target.config)
            target(ids[:, :length], past_key_values=target_cache, use_cache=True)
            new_block = embed_block_tokens(embed, torch.full((1, block), config.mask_token_id))
            positions = torch.arange(needed + 2 * block)[None]
            times = {key: [] for key in ("before", "before_carry", "after", "after_carry", "target", "lm_head_rows",
                                         "lm_head_1_row")}
            anchor = length + 1  # each step commits context row anchor - 1 and drafts from the anchor
            rows = new(block_embeds=new_block, block_position_ids=positions[:, anchor : anchor + block],
                       past_key_values=new_cache, use_cache=True).last_hidden_state[:, 1:]  # proposal-row states

            def old_round(carry: bool) -> None:
                # The old get_candidates step 4 and greedy _pick_tokens: one new context row (+ B-1 carry rows).
                block_ids = torch.full((1, block), config.mask_token_id)
                block_ids[:, 0] = ids[:, anchor]
                out = old(block_embeds=embed_block_tokens(embed, block_ids),
                          block_position_ids=torch.arange(anchor, anchor + block)[None],
                          context_features=features[:, anchor - 1 : anchor],
                          context_position_ids=torch.arange(anchor - 1, anchor)[None],
                          carry_features=features[:, anchor : anchor + block - 1] if carry else None,
                          carry_position_ids=torch.arange(anchor, anchor + block - 1)[None] if carry else None,
                          past_key_values=old_cache, use_cache=True)
                old.proposal_logits(out.last_hidden_state[:, 1:], lm_head).argmax(dim=-1)

            def new_round(carry: bool) -> None:
                new_block[:, :1] = embed_block_tokens(embed, ids[:, anchor : anchor + 1])
                out = new(block_embeds=new_block, block_position_ids=positions[:, anchor : anchor + block],
                          context_features=features[:, anchor - 1 : anchor],
                          context_position_ids=positions[:, anchor - 1 : anchor],
                          carry_features=features[:, anchor : anchor + block - 1] if carry else None,
                          carry_position_ids=positions[:, anchor : anchor + block - 1] if carry else None,
                          past_key_values=new_cache, use_cache=True)
                new.propose(out.last_hidden_state[:, 1:], head, ids[:, anchor], return_logits=False)

            def target_step() -> None:
                target(ids[:, anchor : anchor + 1], past_key_values=target_cache, use_cache=True)
                target_cache.crop(-1)

            runs = {"before": lambda: old_round(False), "before_carry": lambda: old_round(True),
                    "after": lambda: new_round(False), "after_carry": lambda: new_round(True), "target": target_step,
                    "lm_head_rows": lambda: head.argmax(rows), "lm_head_1_row": lambda: head.argmax(rows[:, :1])}
            order = list(runs)
            for step in range(args.warmup + args.repeats):
                # Every item runs once per step; the carry variants' context row is taken back (untimed), so each
                # cache grows by one row per step, as in generation.
                rotated = order[step % len(order):] + order[: step % len(order)]
                for key in rotated:
                    start = time.perf_counter()
                    runs[key]()
                    elapsed = (time.perf_counter() - start) * 1000
                    if step >= args.warmup:
                        times[key].append(elapsed)
                    if key == "before_carry":
                        old_cache.crop(-1)
                    elif key == "after_carry":
                        new_cache.length -= 1
                anchor += 1
            step_ms = statistics.median(times["target"])
            row = {"context_length_start": length, "context_length_end": anchor,
                   "median_ms": {k: statistics.median(v) for k, v in times.items()},
                   "mean_ms": {k: statistics.mean(v) for k, v in times.items()},
                   "times_ms": times}
            row["median_over_target_step"] = {k: v / step_ms for k, v in row["median_ms"].items() if k != "target"}
            row["carry_overhead_median"] = {
                "before": row["median_ms"]["before_carry"] / row["median_ms"]["before"] - 1,
                "after": row["median_ms"]["after_carry"] / row["median_ms"]["after"] - 1,
            }
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "times_ms"}, indent=1))
    report = {
        "command": "python experiments/proposal_before_after.py " + " ".join(sys.argv[1:]),
        "before_commit": args.before_commit,
        "drafter": args.drafter,
        "after_draft_vocab_size": args.draft_vocab_size,
        "threads": args.threads,
        "carryover_hf": carryover_hf.__version__,
        "what": "per step: before proposal (1 new context row; carry variant: plus B-1 carry rows), after proposal "
        "(same), target 1-token step on the L-token cache; rotating order; medians",
        "by_context_length": results,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
