"""The training data: reading it (`load_rows`) and the checks of its contract, run before any model work."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from transformers.utils import logging

from ..errors import UsageError

logger = logging.get_logger(__name__)

REQUIRED_COLUMNS = ("input_ids", "loss_mask")


def load_rows(path: str, name: str = "dataset"):
    """A `datasets.Dataset` from regeneration run folders (one, or several comma-separated), a `save_to_disk` folder
    or a json/jsonl/parquet file.

    A regeneration run still in progress gives its finished chunks in run order (several runs: one after the other),
    so `--max_train_samples N` pins a run to the same first N rows while generation goes on. Run chunks are
    memory-mapped, not loaded into memory."""
    import datasets

    from ..regenerated import STATE_FILE, load_regenerated

    if path is None:
        raise UsageError(f"--{name} is required: the recorded target responses to train on.")
    if "," in path:
        return load_regenerated(path)  # several run folders (other formats are single paths)
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return load_regenerated(path)
    if os.path.isdir(path):
        rows = datasets.load_from_disk(path)
        if isinstance(rows, datasets.DatasetDict):
            if "train" not in rows:
                raise UsageError(
                    f"{path} holds splits {list(rows)}; save the training split alone or name it 'train'."
                )
            rows = rows["train"]
        return rows
    builders = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}
    extension = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path) or extension not in builders:
        raise UsageError(
            f"--{name} {path!r} is neither a `Dataset.save_to_disk` folder nor a {sorted(builders)} file."
        )
    return datasets.load_dataset(builders[extension], data_files=path, split="train")


def token_rows(rows):
    """`{input_ids, loss_mask}` of every row, in order, reading nothing else: a `datasets.Dataset` in batches of the
    two columns, a `FeatureStore` without its feature bytes, any other sequence of rows as it is."""
    if hasattr(rows, "select_columns"):  # datasets.Dataset
        for batch in rows.select_columns(list(REQUIRED_COLUMNS)).iter(batch_size=512):
            yield from ({"input_ids": i, "loss_mask": m} for i, m in zip(batch["input_ids"], batch["loss_mask"]))
    elif hasattr(rows, "token_rows"):  # FeatureStore
        yield from rows.token_rows()
    else:
        yield from rows


def row_lengths(rows) -> list[int]:
    """Tokens per row without reading anything else: a `FeatureStore`'s offsets, a `datasets.Dataset`'s
    `input_ids` column, or the rows themselves."""
    if hasattr(rows, "row_lengths"):  # FeatureStore
        return rows.row_lengths()
    return [len(row["input_ids"]) for row in token_rows(rows)]


def check_training_dataset(
    dataset, vocab_size: int, max_length: int | None = None, name: str = "train_dataset"
) -> None:
    """Validates a `datasets.Dataset` of recorded responses: columns, alignment, token range, length, anchors.

    Raises `ValueError` naming the problem and the fix; warns about rows without any anchor (they add no loss).
    Datasets of other types are checked row by row by the collator instead.
    """
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        return
    missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{name} lacks the column(s) {missing}; it has {dataset.column_names}. Training rows need `input_ids` "
            "and `loss_mask` (1 on target-response tokens), e.g. from `carryover-hf regenerate`."
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty.")

    rows_without_anchor = 0
    for start, table in enumerate(dataset.with_format("arrow").select_columns(list(REQUIRED_COLUMNS)).iter(10_000)):
        ids = pa.chunked_array(table.column("input_ids")).combine_chunks()
        mask = pa.chunked_array(table.column("loss_mask")).combine_chunks()
        id_lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False)
        mask_lengths = pc.list_value_length(mask).to_numpy(zero_copy_only=False)
        offset = start * 10_000
        if (id_lengths != mask_lengths).any():
            row = offset + int(np.flatnonzero(id_lengths != mask_lengths)[0])
            raise ValueError(
                f"{name} row {row}: {id_lengths[row - offset]} input_ids but {mask_lengths[row - offset]} loss_mask "
                "entries; they must align one to one."
            )
        if max_length is not None and id_lengths.max(initial=0) > max_length:
            row = offset + int(np.argmax(id_lengths))
            raise ValueError(
                f"{name} row {row} has {int(id_lengths.max())} tokens, more than the target's {max_length} positions. "
                "Rows are never truncated: filter or split long rows first."
            )
        flat_ids = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
        if flat_ids.size and (flat_ids.min() < 0 or flat_ids.max() >= vocab_size):
            raise ValueError(
                f"{name} holds token ids outside the target's vocabulary [0, {vocab_size}) "
                f"(min {int(flat_ids.min())}, max {int(flat_ids.max())}): was it tokenized for another model?"
            )
        flat_mask = pc.list_flatten(mask).to_numpy(zero_copy_only=False).astype(np.int64)
        if flat_mask.size and not np.isin(flat_mask, (0, 1)).all():
            raise ValueError(f"{name}: loss_mask must hold only 0 and 1.")
        # Anchor a needs a and a + 1 in the response; pairs must not cross row boundaries.
        pairs = (flat_mask[:-1] & flat_mask[1:]).astype(np.int64) if flat_mask.size > 1 else np.zeros(0, np.int64)
        ends = np.cumsum(mask_lengths)
        counts = np.zeros(len(mask_lengths), dtype=np.int64)
        starts = ends - mask_lengths
        cumulative = np.concatenate([[0], np.cumsum(pairs)])
        for_rows = mask_lengths >= 2
        counts[for_rows] = cumulative[ends[for_rows] - 1] - cumulative[starts[for_rows]]
        rows_without_anchor += int((counts == 0).sum())

    if rows_without_anchor == len(dataset):
        raise ValueError(
            f"No row of {name} has two consecutive response tokens (loss_mask 1 at a and a + 1), so there is "
            "nothing to train on. Check that loss_mask marks the target's responses."
        )
    if rows_without_anchor:
        logger.warning(f"{rows_without_anchor} of {len(dataset)} rows of {name} have no anchor and add no loss.")


__all__ = ["REQUIRED_COLUMNS", "check_training_dataset", "load_rows"]
