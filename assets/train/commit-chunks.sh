#!/usr/bin/env bash
# Commits the finished chunks of a regeneration run as they appear: every INTERVAL seconds, the new
# data/chunk-NNNNN.parquet files (with their .json sidecars) and the refreshed regeneration.json summary,
# and nothing outside the run folder.
#   nohup assets/train/commit-chunks.sh assets/train/smollm2-135m 600 > /work/commit-chunks.log 2>&1 &
set -u
run=${1:?usage: commit-chunks.sh RUN_FOLDER [INTERVAL_SECONDS]}
interval=${2:-600}
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
[ -f "$run/regeneration.json" ] || { echo "$run is not a regeneration run folder" >&2; exit 2; }
python=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && python=.venv/bin/python  # the checkout's environment, if any
"$python" -c "import carryover_hf" || { echo "$python cannot import carryover_hf: set PYTHON" >&2; exit 2; }
while true; do
  mapfile -t new < <(git ls-files --others --exclude-standard -- "$run/data/chunk-*.parquet")
  if [ ${#new[@]} -gt 0 ]; then
    if ! "$python" -c "import sys; from carryover_hf.tools.data.regenerate import summarize; summarize(sys.argv[1], write=True)" "$run"; then
      echo "$(date -u +%FT%TZ) the summary of $run failed: nothing committed" >&2; sleep "$interval"; continue
    fi
    files=("$run/regeneration.json")
    names=()
    for path in "${new[@]}"; do
      files+=("$path" "${path%.parquet}.json")
      name=${path##*/chunk-}; names+=("$((10#${name%.parquet}))")
    done
    summary=$("$python" -c "import json, sys; s = json.load(open(sys.argv[1]))['summary']; print(f\"{s['chunks_done']}/{s['chunks_total']} chunks, {s['rows']:,} rows, {s['response_tokens']:,} response tokens\")" "$run/regeneration.json")
    for attempt in $(seq 1 30); do
      if [ -e .git/index.lock ]; then sleep 10; continue; fi
      if git add -- "${files[@]}" && git commit -q -m "Training set: $run chunk(s) ${names[*]} ($summary)" -- "${files[@]}"; then
        echo "$(date -u +%FT%TZ) committed chunk(s) ${names[*]}: $summary"
        break
      fi
      sleep 10
    done
  fi
  sleep "$interval"
done
