"""Quickstart: build a Carryover drafter for a small target, generate with it, print the statistics.

    python examples/quickstart.py

Runs offline in seconds on a CPU with a tiny random Llama-architecture target. With a real model, replace
`tiny_target(...)` by `AutoModelForCausalLM.from_pretrained(...)` and load a trained drafter with
`AutoModel.from_pretrained("org/<target>-carryover-dflash")`; an untrained drafter is lossless but proposes
poorly, so it brings no speedup.
"""

import time

import torch

import carryover_hf  # noqa: F401  (registers the drafter and routes generate() to it)
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.testing import skew_towards_token, tiny_target


def main() -> None:
    torch.manual_seed(0)
    # A tiny target whose LM head favours one token, so an untrained drafter still gets drafts accepted.
    target = skew_towards_token(tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4), 7, 1.0)
    config = CarryoverDrafterConfig.from_target_config(target.config, num_hidden_layers=1, block_size=8)
    drafter = CarryoverDrafterModel(config).eval()
    print(f"target: {sum(p.numel() for p in target.parameters()):,} parameters; drafter: "
          f"{sum(p.numel() for p in drafter.parameters()):,} parameters, layer ids {config.target_layer_ids}")

    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=64, do_sample=False)
    start = time.perf_counter()
    reference = target.generate(prompt, **kwargs)
    target_time = time.perf_counter() - start
    start = time.perf_counter()
    output = target.generate(prompt, assistant_model=drafter, **kwargs)
    drafter_time = time.perf_counter() - start

    stats = drafter.last_generation_stats
    print(f"identical to the target's greedy output: {torch.equal(output, reference)}")
    print(f"verification rounds: {stats.num_rounds}, mean acceptance length: {stats.mean_acceptance_length:.2f}")
    print(f"acceptance lengths: {stats.acceptance_lengths}")
    print(f"carry rows per proposal: {stats.carry_rows}")
    print(f"drafting {stats.drafting_time * 1e3:.1f} ms, verification {stats.verification_time * 1e3:.1f} ms; "
          f"wall time {drafter_time * 1e3:.1f} ms vs target alone {target_time * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
