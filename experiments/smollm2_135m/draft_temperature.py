"""Would sampling the drafter colder than the target raise tau at T = 1? (2026-12-07: no.)

Speculative sampling stays lossless whatever distribution q the drafts are drawn from, as long as q is the one
returned with them (Transformers accepts a draft with probability min(1, p / q)); a drafter that is less confident
than the target might then gain from a sharper q. This wraps `DrafterProposer` to append a
`TemperatureLogitsWarper(s)` to the drafter's processors only (q is the sharpened distribution), and measures pooled
tau with full blocks (carry off, no lookup, no backoff) at T = 1 on 2 held-out prompts per category, 128 tokens, the
same seed per prompt for every s:

    python experiments/smollm2_135m/draft_temperature.py drafters/carryover-hf/smollm2-135m-campaign-markov 2 1.0,0.7,0.5,0.3

Campaign milestone 4, 18 prompts, one thread (the campaign and a training branch on the same 2 cores): tau 1.53 at
s = 1, 1.50 at 0.7, 1.45 at 0.5, 1.35 at 0.3. The drafter (trained with 0.5 KL to the target's top-32) is not
under-confident: drafting colder loses acceptance, so no option was added.
"""

import sys

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

import carryover_hf  # noqa: F401  (registers the drafter)
from carryover_hf import generation
from carryover_hf.modeling_carryover import CarryoverDrafterModel
from carryover_hf.targets import load_target
from carryover_hf.tools.bench.prompts import default_suite_dir, encode_prompt, load_prompts

SCALE = {"s": 1.0}  # the extra temperature of the drafter's distribution in the current call
_init = generation.DrafterProposer.__init__


def _colder(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if SCALE["s"] != 1.0 and self.do_sample:
        self.logits_processor = LogitsProcessorList([*(self.logits_processor or []), TemperatureLogitsWarper(SCALE["s"])])


def main() -> None:
    drafter_path, per_category, scales = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3].split(",")]
    torch.set_num_threads(1)
    generation.DrafterProposer.__init__ = _colder
    target, tokenizer = load_target("smollm2-135m")
    generation.declare_generation_options(target)
    drafter = CarryoverDrafterModel.from_pretrained(drafter_path, dtype=torch.float32).eval()
    prompts = load_prompts(str(default_suite_dir()), split="eval", num_per_category=per_category)
    tokens = {s: [0, 0] for s in scales}  # accepted tokens (bonus included), rounds
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(prompt, tokenizer)
        for s in scales:
            SCALE["s"] = s
            torch.manual_seed(i)
            target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=True,
                            temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=128, use_carryover=False,
                            round_policy="rules", lookup_drafts=0, proposal_backoff=0, lookup_backoff=0,
                            draft_confidence_threshold=0.0)  # fmt: skip
            stats = drafter.last_generation_stats
            tokens[s][0] += sum(stats.acceptance_lengths)
            tokens[s][1] += stats.num_rounds
        print(i, {s: round(a / r, 3) for s, (a, r) in tokens.items()}, flush=True)


if __name__ == "__main__":
    main()
