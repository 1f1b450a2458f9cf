# The proposal defaults every SmolLM2-135M drafter of this project is published with (what a plain
# generate(assistant_model=drafter) uses unless the call passes its own; 0 = off). Since 0.3 the cost-aware round
# policy (round_policy="cost", no tuned numbers: benchmarks/results/smollm2-135m-policy-t0/, -t1/); the rules it
# replaced stay the drafters' options for round_policy="rules": the setting the 0.2 benchmark measured fastest at
# T = 0 on a CPU, context lookup of 10 tokens in front of the drafter and proposal backoff 8
# (benchmarks/results/smollm2-135m-0.2-t0/, docs/smollm2.md; without them a plain generate ran at 0.90x).
# Sourced by experiments/smollm2_135m/release_0_2.sh and gpu.sh; tests/test_shipped_drafters.py reads it too.
SMOLLM2_LOOKUP_DRAFTS=10
SMOLLM2_PROPOSAL_BACKOFF=8
SMOLLM2_ROUND_POLICY=cost
