"""One-off (2026-12-04): target alone vs the shipped Markov drafter's defaults vs round_policy="cost", interleaved per prompt, T = 0, one thread: python experiments/round_policy_probe.py PROMPTS_PER_CATEGORY NEW_TOKENS."""
import json, sys, time
import torch
torch.set_num_threads(1)
import carryover_hf
from carryover_hf.tools.bench.prompts import encode_prompt, load_prompts
from carryover_hf.generation import declare_generation_options
from carryover_hf.round_policy import calibrate
from carryover_hf.targets import load_target
from transformers import AutoModel

per_cat, new = int(sys.argv[1]), int(sys.argv[2])
target, tok = load_target("smollm2-135m", dtype="float32")
declare_generation_options(target)
drafter = AutoModel.from_pretrained("drafters/carryover-hf/smollm2-135m-carryover-markov", dtype=torch.float32)
t0 = time.perf_counter(); cost = calibrate(target, 16); print("calibration", round(time.perf_counter() - t0, 1), "s", [round(c, 2) for c in cost.relative], flush=True)
prompts = load_prompts("suites", split="eval", num_per_category=per_cat)
rows = []
methods = {"target": {}, "defaults": {"assistant_model": drafter}, "cost": {"assistant_model": drafter, "round_policy": "cost"}}
for i, p in enumerate(prompts):
    ids = encode_prompt(p, tok)
    times, outs, stats = {}, {}, {}
    order = list(methods) if i % 2 == 0 else list(methods)[::-1]
    for name in order:
        start = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **methods[name])
        times[name] = time.perf_counter() - start
        outs[name] = out
        if name != "target":
            s = drafter.last_generation_stats
            stats[name] = {"rounds": s.num_rounds, "tau": s.mean_acceptance_length, "lookups": s.lookup_proposals,
                           "plain": sum(1 for d in s.draft_lengths if d == 0)}
    same = all(torch.equal(outs[m], outs["target"]) for m in methods)
    rows.append({"id": p.id, "category": p.category, "times": times, "stats": stats, "identical": same})
    print(p.category, {k: round(times["target"] / v, 2) for k, v in times.items()}, stats.get("cost"), same, flush=True)
json.dump(rows, open("round_policy_probe.json", "w"), indent=1)
tot = {m: sum(r["times"][m] for r in rows) for m in methods}
print("pooled speedup", {m: round(tot["target"] / tot[m], 3) for m in methods})
cats = sorted({r["category"] for r in rows})
for c in cats:
    sub = [r for r in rows if r["category"] == c]
    print(c, {m: round(sum(r["times"]["target"] for r in sub) / sum(r["times"][m] for r in sub), 2) for m in methods})
