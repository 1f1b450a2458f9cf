"""Write a training run's `segment.json` once, before it trains: the command, the data, a note, the start and the
machine. `chain_curves.py` copies it into the training record, so the record says how the run was made even when the
run folder is gone (a later session's machine may not have it).

    python experiments/smollm2_135m/segment_meta.py FOLDER NOTE DATA COMMAND...

A folder that already has one keeps it (a resumed run is the same segment).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from carryover_hf.tools.bench.report import machine  # the benchmark journal's name of the machine, the same reading


def cpu_model() -> str:
    return machine(torch.device("cpu"))


def main(folder: str, note: str, data: str, *command: str) -> None:
    path = Path(folder) / "segment.json"
    if path.is_file():
        return
    if not command:
        sys.exit("segment_meta.py: give the training command after FOLDER NOTE DATA")
    path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    meta = {"command": f"OMP_NUM_THREADS={threads} {shlex.join(command)}", "data": data, "note": note,
            "wall": f"started {started} on {cpu_model()}; its train_runtime is in the run's trainer_state.json"}
    path.write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
