"""One temperature of a `carryover-hf bench` journal (runs.jsonl), summarised with the bench's own `summarize` and
`compare` before the whole run has finished: speedup and tau of each method over the prompts every method has run,
the mean over categories, the paired comparison of two methods (default m5/policy_alone against m4/policy_alone),
and the speedup per category.

    python experiments/smollm2_135m/journal_summary.py ../runs/alone-m5/runs.jsonl 0 [A B]

Written for the 2026-12-07 drafter-alone bench of campaign milestones 4 and 5
(benchmarks/results/smollm2-135m-campaign-alone-m5/), read while its T = 1 half was running."""
import json
import sys
import types
from collections import defaultdict

from carryover_hf.tools.bench.report import compare, summarize

path, temperature = sys.argv[1], float(sys.argv[2])
first, second = sys.argv[3:5] if len(sys.argv) > 4 else ("m5/policy_alone", "m4/policy_alone")
with open(path) as journal:
    groups = [json.loads(line)["group"] for line in journal if '"group"' in line]
groups = [g for g in groups if g["temperature"] == temperature]
by = defaultdict(dict)
for g in groups:
    for r in g["runs"]:
        by[r["method"]][g["prompt_id"]] = types.SimpleNamespace(**r)
ids = sorted(set.intersection(*[set(v) for v in by.values()]))
print(len(ids), "prompts", sorted(by))
cats = sorted({i.split("/")[0] for i in ids})
target = [by["target"][i] for i in ids]
methods = [m for m in sorted(by) if m != "target"]


def category_speedups(method: str) -> dict[str, float]:
    """The method's speedup over the target alone in each category (its prompts only)."""
    out = {}
    for category in cats:
        cid = [i for i in ids if i.startswith(category + "/")]
        runs, base = [by[method][i] for i in cid], [by["target"][i] for i in cid]
        out[category] = summarize(runs, base, True, None, n_resamples=200)["speedup"]["estimate"]
    return out


per_category = {m: category_speedups(m) for m in methods}
for m in methods:
    s = summarize([by[m][i] for i in ids], target, True, None, n_resamples=2000)
    per = list(per_category[m].values())
    print(m, "speedup", {k: round(v, 3) for k, v in s["speedup"].items() if isinstance(v, float)},
          "tau", round(s["acceptance_length_micro"]["estimate"], 3), "mean over categories",
          round(sum(per) / len(per), 3), "min cat", round(min(per), 3))
paired = compare([by[first][i] for i in ids], [by[second][i] for i in ids], True, n_resamples=2000)
print(f"{first} vs {second}: tau gain", {k: round(v, 4) for k, v in paired["acceptance_length_relative_gain"].items()
                             if isinstance(v, float)},
      "speed", {k: round(v, 4) for k, v in paired["speed_ratio"].items() if isinstance(v, float)})
for m in methods:
    print(m, "; ".join(f"{c} {v:.2f}x" for c, v in per_category[m].items()))
