"""A regeneration run folder: what `carryover-hf regenerate` writes and training reads.

`STATE_FILE` holds the run's identity and summary; `DATA_DIR/chunk-NNNNN.parquet` its finished chunks of rows
(`row_features()`), each written whole. `load_regenerated` reads one run or several as one `datasets.Dataset`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STATE_FILE = "regeneration.json"
DATA_DIR = "data"


def chunk_path(output: Path, index: int) -> Path:
    """The parquet file of chunk `index` (it exists only once the chunk is complete)."""
    return output / DATA_DIR / f"chunk-{index:05d}.parquet"


def row_features():
    """The `datasets.Features` of a row, as every chunk is written and read."""
    from datasets import Features, Sequence, Value

    return Features(
        {
            "id": Value("string"),
            "category": Value("string"),
            "split": Value("string"),
            "source": Value("string"),
            "license": Value("string"),
            "system": Value("string"),
            "turns": Sequence(Value("string")),
            "responses": Sequence(Value("string")),
            "text": Value("string"),
            "input_ids": Sequence(Value("int32")),
            "loss_mask": Sequence(Value("int8")),
            "num_response_tokens": Value("int32"),
            "finished": Value("bool"),
            "target": Value("string"),
            "generation": Value("string"),
        }
    )


def run_folders(paths) -> list[Path]:
    """Run folders from one path, a comma-separated string of paths, or a list of them (order kept)."""
    if isinstance(paths, (str, Path)):
        paths = [part for part in str(paths).split(",") if part.strip()]
    folders = [Path(str(path).strip()) for path in paths]
    if not folders:
        raise ValueError("no regeneration run folder given")
    problems = [f"{folder} is not a regeneration run folder (no {STATE_FILE})" for folder in folders
                if not (folder / STATE_FILE).is_file()]  # fmt: skip
    if len(set(map(os.path.realpath, folders))) < len(folders):
        problems.append("the same run folder is given twice")
    if not problems and len(folders) > 1:
        targets = {str(f): json.loads((f / STATE_FILE).read_text()).get("identity", {}).get("target") for f in folders}
        if len(set(targets.values())) > 1:
            problems.append(f"the runs answer different targets: {targets}")
    if problems:
        raise ValueError("cannot load regenerated rows:\n  - " + "\n  - ".join(problems))
    return folders


def load_regenerated(output):
    """The rows of one or several regeneration runs as one `datasets.Dataset`: each run's finished chunks in run
    order, the runs in the order given (`output`: a folder, a comma-separated string of folders, or a list).

    Each chunk is converted once to an Arrow file in the `datasets` cache and memory-mapped; the chunks are
    concatenated without copying, so the rows are read from disk as they are used, not held in memory."""
    import datasets as datasets_logging
    from datasets import Dataset, concatenate_datasets

    files = []
    for folder in run_folders(output):
        found = sorted((folder / DATA_DIR).glob("chunk-*.parquet"))
        if not found:
            raise FileNotFoundError(
                f"no finished chunks under {folder / DATA_DIR}; run `carryover-hf regenerate` first"
            )
        files += found
    features = row_features()
    quiet = not datasets_logging.are_progress_bars_disabled()
    if quiet:  # one bar per chunk would flood the output
        datasets_logging.disable_progress_bars()
    try:
        parts = [Dataset.from_parquet(str(path), features=features) for path in files]
    finally:
        if quiet:
            datasets_logging.enable_progress_bars()
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def response_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each generated span of a row: the runs of 1 in its loss mask (one per answered turn)."""
    spans, start = [], None
    for i, m in enumerate(list(loss_mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


__all__ = ["DATA_DIR", "STATE_FILE", "chunk_path", "load_regenerated", "response_spans", "row_features", "run_folders"]
