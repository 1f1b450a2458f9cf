#!/usr/bin/env bash
# Runs one call of the GPU job on the device machine (its repository root): bash gpu_job/run_on_device.sh CALL SECONDS
# CALL 1: CUDA checks and the round profile (no target needed) and keeps the target's first part for call 2;
# CALL 2: reassembles the target, regenerates data, trains, packs; CALL 3: hands back what call 2 packed but could
# not return. SECONDS is the job's own budget (the tool's timeout minus the time to start and return).
# docs/gpu.md gives the procedure; gpu_job/travel.py prepares the calls.
set -uo pipefail
call=${1:?usage: run_on_device.sh CALL SECONDS} budget=${2:?usage: run_on_device.sh CALL SECONDS}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:?OUT must name the folder whose files come back}
WORK=${CARRYOVER_GPU_WORK:-/root/carryover-gpu}
PY=${PY:-python3}
mkdir -p "$WORK"
SITE=$WORK/site
# Packages the machine's image lacks travel as wheels in .gpu/wheels (gpu_job/travel.py prepare).
if [ ! -f "$SITE/.installed" ] && ls .gpu/wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/wheels/*.whl \
    && touch "$SITE/.installed" || { echo "run_on_device.sh: installing .gpu/wheels failed" >&2; exit 5; }
fi
export PYTHONPATH=$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PY
"$PY" gpu_job/job.py --call "$call" --budget "$budget" --out "$OUT" --work "$WORK" 2>&1 | tee -a "$OUT/log-call$call.txt"
exit "${PIPESTATUS[0]}"
