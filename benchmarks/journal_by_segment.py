"""Pooled speedup and acceptance length of each method, per invocation (segment) of a journaled benchmark.

A journaled run (`carryover-hf bench ... --resume`) may be timed over several sessions on different machines; its
report pools them. This splits the journal by segment, with the machine each one recorded:

    python benchmarks/journal_by_segment.py benchmarks/results/smollm2-135m-0.2-t0 [--output by_segment.json]

Speedup: the method's decode tokens per second over the target alone's, pooled over the segment's prompts (as the
report's, without intervals); tau: accepted tokens per verification round, bonus included, pooled. Segments hold
different prompts (prompts are measured round-robin), so a difference between segments mixes machine and prompts.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from carryover_hf.tools.bench.journal import read_journal


def by_segment(journal: Path) -> list[dict]:
    _, segment_lines, groups = read_journal(journal)
    segments = {e["segment"]: e for e in segment_lines}
    totals = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0, 0]))  # segment -> method -> tokens, s, accepted, rounds
    prompts = defaultdict(set)
    for group in groups:
        prompts[group["segment"]].add((group["temperature"], group["prompt_id"]))
        for run in group["runs"]:
            total = totals[group["segment"]][run["method"]]
            total[0] += run["decode_tokens"]
            total[1] += run["decode_time"]
            total[2] += sum(run["acceptance_lengths"])
            total[3] += len(run["acceptance_lengths"])
    out = []
    for number in sorted(totals):
        methods = totals[number]
        target = methods["target"][0] / methods["target"][1]
        out.append({
            "segment": number,
            "started": segments.get(number, {}).get("started"),
            "machine": segments.get(number, {}).get("machine"),
            "prompts": len(prompts[number]),
            "target_tokens_per_second": target,
            "methods": {
                name: {"speedup": (t[0] / t[1]) / target, "tau_micro": t[2] / t[3] if t[3] else None}
                for name, t in sorted(methods.items()) if name != "target"
            },
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a benchmark output folder (with runs.jsonl) or the journal itself")
    parser.add_argument("--output", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    journal = args.run / "runs.jsonl" if args.run.is_dir() else args.run
    if not journal.is_file():
        raise SystemExit(f"{journal} is not a file: give a benchmark output folder with a runs.jsonl journal.")
    segments = by_segment(journal)
    for seg in segments:
        print(f"\nsegment {seg['segment']} ({seg['started']}, {seg['machine'] or 'machine not recorded'}): "
              f"{seg['prompts']} prompts, target alone {seg['target_tokens_per_second']:.1f} tok/s\n")
        print("| method | speedup | tau micro |\n| --- | --- | --- |")
        for name, m in seg["methods"].items():
            tau = "–" if m["tau_micro"] is None else f"{m['tau_micro']:.2f}"
            print(f"| {name} | {m['speedup']:.2f}x | {tau} |")
    if args.output:
        args.output.write_text(json.dumps(segments, indent=1) + "\n")


if __name__ == "__main__":
    main()
