"""Trace the cost-aware round policy's choices in one greedy call: per round, the sources offered, the choice, the
expected tokens of each source and the priced costs (ms: a plain step, the drafter and the lookup at 1 and 5 drafts).

    python experiments/smollm2_135m/policy_trace.py panel|nopanel [--cost measured|calibrate] [--prompt math_reasoning 3]

`nopanel` keeps the tuned kernel choice but without the panel kernel. One thread; the shipped campaign drafter.
"""

import argparse

import torch

from carryover_hf import round_policy
from carryover_hf.generation import declare_generation_options
from carryover_hf.hub.loading import load_drafter
from carryover_hf.targets import load_target
from carryover_hf.tools import cpu_kernels
from carryover_hf.tools.cpu_kernels import SkinnyChoice, apply_cpu_kernels, use_skinny_choice
from carryover_hf.tools.data.suites import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", choices=("panel", "nopanel"))
    parser.add_argument("--cost", default="measured", choices=("measured", "calibrate"))
    parser.add_argument("--prompt", nargs=2, default=["math_reasoning", "3"], metavar=("CATEGORY", "INDEX"))
    parser.add_argument("--every", type=int, default=6, help="print every Nth round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer = load_target("smollm2-135m", dtype="float32")
    declare_generation_options(target)
    drafter = load_drafter("drafters/carryover-hf/smollm2-135m-campaign-markov", target)
    apply_cpu_kernels(target, drafter)
    if args.kernels == "nopanel":
        use_skinny_choice(SkinnyChoice(**{**cpu_kernels._Skinny.choice.__dict__, "panel_from": None}))
    print("kernels:", cpu_kernels._Skinny.choice.describe())
    trace, chosen = [], round_policy.best_proposal

    def traced(estimates, available, cost, drafts_only=False, rate=None):
        choice = chosen(estimates, available, cost, drafts_only, rate)
        expected = {s: [round(x, 2) for x in estimates[s].expected_tokens_up_to(min(available[s], 7))]
                    for s in available if s in estimates}  # fmt: skip
        priced = {"plain": round(1e3 * cost(None, 0), 1)}
        priced.update({f"{s} {k}": round(1e3 * cost(s, k), 1) for s in available for k in (1, min(available[s], 5))})
        trace.append((dict(available), (choice.source, choice.drafts), expected, priced))
        return choice

    round_policy.best_proposal = traced
    category, index = args.prompt
    prompt = load_prompts("eval", [category])[int(index)]
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["turns"][0]}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    options = dict(max_new_tokens=128, do_sample=False, verification_cost=args.cost)
    target.generate(**inputs, assistant_model=drafter, **{**options, "max_new_tokens": 16})  # warm-up
    trace.clear()
    target.generate(**inputs, assistant_model=drafter, **options)
    stats = drafter.last_generation_stats
    print(f"tau {stats.mean_acceptance_length:.2f} over {stats.num_rounds} rounds")
    for row in trace[:: args.every]:
        print(*row)


if __name__ == "__main__":
    main()
