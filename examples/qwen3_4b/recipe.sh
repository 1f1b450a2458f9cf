#!/usr/bin/env bash
# The Qwen3-4B Carryover drafter, from z-lab's public DFlash checkpoint to a pushed org/qwen3-4b-carryover-dflash.
# What each stage needs on a GPU, and how long it takes: docs/qwen3-4b.md.
#
#   bash examples/qwen3_4b/recipe.sh [stage ...]      (or STAGES="bench push" bash ...; default: all, in order)
#   stages: fetch convert regenerate features baseline carryover bench push
#
#   fetch       Qwen/Qwen3-4B and z-lab/Qwen3-4B-DFlash-b16 into the Hub cache (hf download; resumes)
#   convert     the z-lab checkpoint as a Carryover drafter (skipped when done)
#   regenerate  the target's own answers to the train prompt suites (resumes chunk by chunk; skipped with DATASET=)
#   features    the target's states at the drafter's layers, once per row (resumes shard by shard)
#   baseline    continued baseline: the converted drafter + EPOCHS epochs of the DFlash objective (from the features)
#   carryover   the converted drafter + the same EPOCHS epochs of the draft-verify-draft objective (target online)
#   bench       both drafters on the eval suites, T = 0 and T = 1, paired intervals (one report per temperature)
#   push        the carryover drafter with the T = 0 table in its card: a dry run into $RUNS/upload unless PUSH=1
#
# Every stage can be rerun: finished stages are skipped, interrupted ones resume (training from its last checkpoint).
# Settings (environment): RUNS, DATASET (rows with input_ids + loss_mask instead of regenerating), EPOCHS, NUM_GPUS
# (1 or 8), PER_DEVICE_BATCH, GRAD_ACCUM, NUM_ANCHORS, LEARNING_RATE, USE_FEATURES (0: train the baseline online),
# BENCH_PROMPTS (per category; default all), REPO, PUSH=1 (with HF_TOKEN) to upload.
#
# CARRYOVER_REHEARSAL=1 runs every stage on the CPU with tiny stand-ins from carryover_hf.tools.testing (a random Qwen3
# target with a chat tokenizer and a random z-lab-format drafter, put into $HF_HUB_CACHE instead of downloaded) and
# tiny sizes; tests/test_qwen3_4b_recipe.py runs it. Nothing else changes: the same commands run in the same order.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=examples/qwen3_4b

if [ "${CARRYOVER_REHEARSAL:-0}" = 1 ]; then
  : "${HF_HUB_CACHE:?CARRYOVER_REHEARSAL=1 builds its tiny repositories into HF_HUB_CACHE; set it to a scratch folder}"
  export HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
  TARGET=carryover-hf-rehearsal/tiny-qwen3 ZLAB=carryover-hf-rehearsal/tiny-qwen3-dflash-b4
  REPO=${REPO:-carryover-hf-rehearsal/tiny-qwen3-carryover-dflash}
  RUNS=${RUNS:?CARRYOVER_REHEARSAL=1 needs RUNS (a scratch folder)}
  DEVICE=cpu DTYPE=float32 ACCELERATE=(--num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no)
  PRECISION=(--use_cpu) EPOCHS=${EPOCHS:-1} NUM_ANCHORS=${NUM_ANCHORS:-8} PER_DEVICE_BATCH=${PER_DEVICE_BATCH:-4}
  GRAD_ACCUM=${GRAD_ACCUM:-1} LEARNING_RATE=${LEARNING_RATE:-1e-3} SAVE_STEPS=2
  REGENERATE=(--limit_per_category 2 --categories translation qa code writing --max_new_tokens 12 --max_length 2048
              --batch_size 4 --chunk_size 4 --num_threads 1)
  FEATURES=(--batch_size 2 --shard_rows 2 --num_threads 1)
  BENCH_PROMPTS=${BENCH_PROMPTS:-1} BENCH=(--max_new_tokens 8 --category translation qa --no_overhead --warmup 0
                                            --bootstrap_resamples 200 --threads 1 --no_progress)
else
  TARGET=Qwen/Qwen3-4B ZLAB=z-lab/Qwen3-4B-DFlash-b16 REPO=${REPO:-org/qwen3-4b-carryover-dflash}
  RUNS=${RUNS:-runs/qwen3-4b}
  NUM_GPUS=${NUM_GPUS:-1}
  case "$NUM_GPUS" in
    1) ACCELERATE=(--config_file "$HERE/accelerate-1gpu.yaml") ;;
    8) ACCELERATE=(--config_file "$HERE/accelerate-8gpu-fsdp.yaml") ;;
    *) echo "NUM_GPUS must be 1 or 8 (the committed accelerate configs); got $NUM_GPUS" >&2; exit 2 ;;
  esac
  DEVICE=cuda DTYPE=bfloat16 PRECISION=(--bf16 true --tf32 true)
  EPOCHS=${EPOCHS:-3} NUM_ANCHORS=${NUM_ANCHORS:-512} PER_DEVICE_BATCH=${PER_DEVICE_BATCH:-4}
  GRAD_ACCUM=${GRAD_ACCUM:-$((32 / (NUM_GPUS * PER_DEVICE_BATCH) > 0 ? 32 / (NUM_GPUS * PER_DEVICE_BATCH) : 1))}
  LEARNING_RATE=${LEARNING_RATE:-6e-4} SAVE_STEPS=500
  REGENERATE=(--max_new_tokens 2048 --max_length 3072 --batch_size 64 --chunk_size 256)
  FEATURES=(--batch_size 8 --shard_rows 256)
  # The paper's 844 prompts: HumanEval 164, tool calling 200, 80 each of the six others (every eval prompt of these).
  BENCH_PROMPTS=${BENCH_PROMPTS:-} BENCH=(--max_new_tokens 512 --warmup 1 --no_progress --category code tool_calling
                                          math_reasoning mt_bench qa rag summarization translation)
fi
USE_FEATURES=${USE_FEATURES:-1}
CONVERTED=$RUNS/converted
DATA=${DATASET:-$RUNS/regenerated}

fail() { echo "$*" >&2; exit 2; }
# Cheap checks before any expensive work.
case "$EPOCHS" in ''|*[!0-9]*) echo "EPOCHS must be a whole number of epochs, got '$EPOCHS'" >&2; exit 2 ;; esac
if [ -n "${DATASET:-}" ] && [ ! -e "$DATASET" ]; then echo "DATASET=$DATASET does not exist" >&2; exit 2; fi
if [ "${PUSH:-0}" = 1 ] && [ -z "${HF_TOKEN:-}" ] && [ "${CARRYOVER_REHEARSAL:-0}" != 1 ]; then
  echo "PUSH=1 uploads to $REPO and needs a write token in HF_TOKEN" >&2; exit 2
fi

resume() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint last" || true; }
done_training() { [ -f "$1/model.safetensors" ] && [ -f "$1/train_results.json" ]; }

stage_fetch() {
  if [ "${CARRYOVER_REHEARSAL:-0}" = 1 ]; then python -m carryover_hf.tools.testing rehearsal-hub "$HF_HUB_CACHE"; fi
  # Only what the stages read: configs, tokenizer, safetensors weights. Offline (HF_HUB_OFFLINE=1) it resolves the cache.
  local repo path
  for repo in "$TARGET" "$ZLAB"; do
    # Assigned on its own line: a failed download stops the script (set -e) instead of vanishing inside an echo.
    path=$(hf download "$repo" --include "*.json" --include "*.safetensors" --include "*.txt" --include "*.jinja" --quiet) ||
      fail "fetch: hf download $repo failed (offline without it in the Hub cache? unset HF_HUB_OFFLINE or copy it in)"
    echo "$repo -> $path"
  done
}

stage_convert() {
  if [ -f "$CONVERTED/model.safetensors" ]; then echo "$CONVERTED exists"; return; fi
  rm -rf "$CONVERTED.tmp"
  carryover-hf convert "$ZLAB" "$CONVERTED.tmp" --target "$TARGET"
  mv "$CONVERTED.tmp" "$CONVERTED"
}

stage_regenerate() {
  if [ -n "${DATASET:-}" ]; then echo "using DATASET=$DATASET"; return; fi
  python examples/on_device.py "$DEVICE" regenerate --target "$TARGET" --dtype "$DTYPE" --split train \
    --output "$DATA" "${REGENERATE[@]}"
}

stage_features() {
  if [ "$USE_FEATURES" != 1 ]; then echo "USE_FEATURES=$USE_FEATURES: the baseline trains online"; return; fi
  # bfloat16 storage: the target computes in bf16, and Qwen-family states can exceed float16's range.
  python examples/on_device.py "$DEVICE" features --target "$TARGET" --target_dtype "$DTYPE" --dataset "$DATA" \
    --drafter "$CONVERTED" --dtype bfloat16 --output "$RUNS/features" "${FEATURES[@]}"
}

# The converted drafter reads the full vocabulary (no --draft_vocab_size: that is for new drafters) and trains in
# fp32 master weights (--drafter_dtype float32; z-lab publishes bf16 weights) under bf16 autocast on GPUs.
train() {
  local out=$1; shift
  if done_training "$out"; then echo "$out is trained"; return; fi
  accelerate launch "${ACCELERATE[@]}" -m carryover_hf train --target "$TARGET" --target_dtype "$DTYPE" \
    --drafter "$CONVERTED" --drafter_dtype float32 --num_train_epochs "$EPOCHS" --num_anchors "$NUM_ANCHORS" \
    --per_device_train_batch_size "$PER_DEVICE_BATCH" --gradient_accumulation_steps "$GRAD_ACCUM" \
    --learning_rate "$LEARNING_RATE" --save_steps "$SAVE_STEPS" --save_total_limit 2 --logging_steps 10 \
    --report_to none --seed 0 --dataloader_num_workers 0 "${PRECISION[@]}" --output_dir "$out" $(resume "$out") "$@"
}

stage_baseline() {  # the continued-baseline control: same start, same epochs, the DFlash objective
  if [ "$USE_FEATURES" = 1 ]; then train "$RUNS/continued" --objective dflash --features "$RUNS/features" --dataset "$DATA"
  else train "$RUNS/continued" --objective dflash --dataset "$DATA"; fi
}

stage_carryover() {  # draft-verify-draft runs the target online (verification), so it reads the rows, not the store
  train "$RUNS/carryover" --objective carryover --dataset "$DATA"
}

stage_bench() {
  for T in 0 1; do
    if [ -f "$RUNS/bench-t$T/results.json" ]; then echo "$RUNS/bench-t$T exists"; continue; fi
    carryover-hf bench --target "$TARGET" --dtype "$DTYPE" --device "$DEVICE" \
      --drafter continued="$RUNS/continued" --drafter carryover="$RUNS/carryover" \
      --methods target carry_off carry_on ${BENCH_PROMPTS:+--num_prompts "$BENCH_PROMPTS"} --temperatures "$T" --seed 0 \
      --output_dir "$RUNS/bench-t$T.tmp" "${BENCH[@]}"
    rm -rf "$RUNS/bench-t$T"; mv "$RUNS/bench-t$T.tmp" "$RUNS/bench-t$T"
  done
}

stage_push() {
  local note="Eval prompt suites of carryover-hf (${BENCH_PROMPTS:-all} prompts per category), T = 0, batch size 1, $DTYPE, \
Transformers assisted decoding. tau = mean accepted tokens per round (bonus included); speedup over the target alone; \
brackets: 95% bootstrap intervals over prompts. The T = 1 table and the paired comparison with the continued baseline \
(same start, same $EPOCHS epochs, DFlash objective) are in the bench reports of the recipe."
  local data="the target's own answers to the train prompt suites of carryover-hf ($DATA)"
  local where=(--dry-run "$RUNS/upload/carryover")
  if [ "${PUSH:-0}" = 1 ]; then where=(); fi
  rm -rf "$RUNS/upload/carryover"
  carryover-hf push "$RUNS/carryover" "$REPO" --dtype bfloat16 --carry on --base-model "$TARGET" \
    --evaluation "$RUNS/bench-t0/results.json" --evaluation-method carryover/carry_on --evaluation-temperature 0 \
    --evaluation-note "$note" --training-data "$data, continued from $ZLAB for $EPOCHS epochs" "${where[@]}"
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || read -r -a stages <<< "${STAGES:-fetch convert regenerate features baseline carryover bench push}"
for stage in "${stages[@]}"; do
  declare -F "stage_$stage" >/dev/null || { echo "unknown stage '$stage'" >&2; exit 2; }
done
for stage in "${stages[@]}"; do
  echo "== $stage  ($(date -u +%H:%M:%S))"; "stage_$stage"
done
