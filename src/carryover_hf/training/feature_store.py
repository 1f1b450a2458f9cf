"""Offline target features: run the frozen target once per training row, store what the drafter reads, train from it.

`carryover-hf features` writes, for every row of a training set, the fused outputs of the drafter's
`target_layer_ids` (exactly `features.gather_target_features` of the target's forward) and optionally the target's
top-k next-token log-probabilities, into memory-mappable safetensors shards:

    DIR/features.json              settings, fingerprint, shard list (rows, tokens, bytes), progress
    DIR/shard-00000.safetensors    input_ids (N,) int32, loss_mask (N,) int8, offsets (rows + 1,) int64,
                                   features (N, k * H) bf16/fp16/fp32, [topk_ids (N, K) int32, topk_logprobs (N, K)]

N is the number of tokens of the shard's rows, concatenated. A shard is written to a temporary name and renamed when
complete, so an interrupted run resumes at its first missing shard. The build's fingerprint covers the target (name,
config and a checksum of its weights), the layer ids, the storage dtype, the top-k and the shard size; every shard
also records the fingerprint of its own rows (tokens and loss mask). So a store follows a growing dataset (a
regeneration run that gains chunks): rerunning the same command checks the stored shards against the dataset's first
rows and encodes only the rows that are new (a short last shard is redone). Rows that differ are an error, as is any
other setting.

`FeatureStore(DIR)` is a `torch.utils.data.Dataset` of rows `{input_ids, loss_mask, target_features, ...}` that reads
only the bytes of the row asked for; `CarryoverDataCollator` pads them and the dflash objective then trains with no
target forward (it needs only the target's input embedding and LM head).

```bash
carryover-hf features --target smollm2-135m --dataset assets/train/smollm2-135m --output runs/features \
    --target_layer_ids 1 8 14 20 27 --top_k 32
carryover-hf train --target smollm2-135m --features runs/features --objective dflash --output_dir runs/baseline ...
```
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UsageError
from ..utils import json_fingerprint, model_fingerprint, weights_fingerprint
from .data import check_training_dataset, load_rows, token_rows

MANIFEST = "features.json"
FORMAT_VERSION = 2  # 2: per-shard data fingerprints, so a store can grow with its dataset
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_TOKEN_TENSORS = ("input_ids", "loss_mask", "offsets")


class FeatureStoreError(UsageError):
    """A feature store that is missing, incomplete, damaged or made for another target, drafter or dataset."""


# -- fingerprints -------------------------------------------------------------------------------------------------
target_fingerprint = model_fingerprint  # the target a store was made from


def dataset_fingerprint(rows) -> str:
    """A checksum of every row's `input_ids` and `loss_mask`, in order."""
    return _row_digests(rows, None)[0]


def shard_fingerprints(rows, shard_rows: int) -> list[str]:
    """`dataset_fingerprint` of each run of `shard_rows` rows (the last run may be shorter), in one pass."""
    return _row_digests(rows, shard_rows)


def _row_digests(rows, group: int | None) -> list[str]:
    digests, digest, count = [], hashlib.sha256(), 0
    for row in token_rows(rows):
        digest.update(np.asarray(row["input_ids"], dtype=np.int64).tobytes())
        digest.update(b"|")
        digest.update(np.asarray(row["loss_mask"], dtype=np.int8).tobytes())
        digest.update(b"\n")
        count += 1
        if group is not None and count % group == 0:
            digests.append(digest.hexdigest()[:16])
            digest = hashlib.sha256()
    if group is None or count % group:
        digests.append(digest.hexdigest()[:16])
    return digests


def _combined(fingerprints: list[str]) -> str:
    return hashlib.sha256(",".join(fingerprints).encode()).hexdigest()[:16]


# -- building -----------------------------------------------------------------------------------------------------
@dataclass
class FeatureBuildConfig:
    """Options of `carryover-hf features`."""

    output: str = field(metadata={"help": "output folder (an unfinished build there is resumed)"})
    dataset: str = field(default=None, metadata={"help": "training rows (same formats as `carryover-hf train --dataset`)"})
    target: str = field(default="smollm2-135m", metadata={"help": "target alias, local folder or Hub id"})
    target_dtype: str = field(
        default="float32",
        metadata={
            "help": "dtype the target runs in (bfloat16: ~2.6x faster on a CPU with AVX-512 BF16 or AMX, features "
            "within ~1% of float32's; the store still trains drafters for the float32 target)"
        },
    )
    target_layer_ids: list[int] | None = field(
        default=None, metadata={"help": "target layers to store (default: those of --drafter, else DFlash's spread)"}
    )
    drafter: str | None = field(default=None, metadata={"help": "drafter folder whose target_layer_ids to store"})
    num_layer_ids: int = field(default=5, metadata={"help": "layer ids spread as DFlash does when none are given"})
    dtype: str = field(
        default="float16",
        metadata={
            "help": "storage dtype of the features (float16: the smallest effect on the loss measured; a value "
            "beyond its range is an error that asks for bfloat16)",
            "choices": list(STORAGE_DTYPES),
        },
    )
    top_k: int = field(default=0, metadata={"help": "also store the target's top-k next-token log-probs (0: none)"})
    shard_rows: int = field(default=64, metadata={"help": "rows per shard file (the resumable unit)"})
    batch_size: int = field(default=4, metadata={"help": "rows per target forward (a shard's rows batched by length, right-padded)"})
    max_rows: int | None = field(default=None, metadata={"help": "store only the first N rows"})
    max_shards: int | None = field(default=None, metadata={"help": "stop after this many new shards"})
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads"})


def _settings(config: FeatureBuildConfig, target, layer_ids: list[int], rows) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "target": config.target,
        "target_fingerprint": target_fingerprint(target),
        "target_weights_fingerprint": weights_fingerprint(target),  # the same for the target in float32 and bfloat16
        "target_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
        "target_hidden_size": target.config.get_text_config().hidden_size,
        "target_layer_ids": list(layer_ids),
        "dtype": config.dtype,
        "top_k": config.top_k,
        "shard_rows": config.shard_rows,
    }


def fingerprint_of(settings: dict) -> str:
    """The build's fingerprint: everything but the rows (each shard records its rows' own fingerprint)."""
    keys = ("format_version", "target_fingerprint", "target_dtype", "target_layer_ids", "dtype", "top_k", "shard_rows")
    return json_fingerprint({k: settings[k] for k in keys})


def _kept_shards(manifest: dict, rows, expected: list[str], out: Path) -> list[dict]:
    """The stored shards that hold exactly the dataset's rows at their place (`expected`: the dataset's shard
    fingerprints); raises where they hold other rows. A short last shard whose rows begin the dataset's longer run
    is dropped, to be encoded again with the rows the dataset has gained."""
    stored, kept, lo = manifest["shards"], [], 0
    for index, shard in enumerate(stored):
        if index < len(expected) and shard["data_fingerprint"] == expected[index]:
            kept.append(shard)
            lo += shard["rows"]
            continue
        grown = (
            index == len(stored) - 1
            and index < len(expected)
            and lo + shard["rows"] < len(rows)
            and shard["data_fingerprint"] == dataset_fingerprint(_slice(rows, lo, lo + shard["rows"]))
        )
        if grown:
            break
        raise FeatureStoreError(
            f"{out} holds other rows than the dataset given (from row {lo}, shard {shard['file']}; the store has "
            f"{sum(s['rows'] for s in stored)} rows, the dataset {len(rows)}): use a new --output folder for this "
            "dataset, or delete this one to rebuild it."
        )
    return kept


def _slice(rows, lo: int, hi: int):
    return rows.select(range(lo, hi)) if hasattr(rows, "select") else rows[lo:hi]


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


@torch.no_grad()
def _encode_rows(target, rows: list[dict], layer_ids: list[int], dtype: torch.dtype, top_k: int, batch_size: int):
    """The shard tensors of `rows`, in their order: one right-padded target forward per `batch_size` rows, the rows
    batched by length (so a short row is not padded to a long one's length)."""
    from .verification import target_forward, target_logits

    keys = ["input_ids", "loss_mask", "features"] + (["topk_ids", "topk_logprobs"] if top_k else [])
    encoded: list[dict[str, torch.Tensor]] = [{} for _ in rows]  # per row, filled in length order
    by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    device = next(target.parameters()).device
    for start in range(0, len(rows), batch_size):
        where = by_length[start : start + batch_size]
        batch = [rows[i] for i in where]
        lengths = [len(row["input_ids"]) for row in batch]
        ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(batch):
            ids[i, : lengths[i]] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            mask[i, : lengths[i]] = 1
        states = target_forward(target, ids.to(device), mask.to(device), layer_ids, with_last_hidden_state=top_k > 0)
        if dtype == torch.float16:
            largest = float(states.features.abs().max())
            if largest > torch.finfo(torch.float16).max:
                raise FeatureStoreError(
                    f"A target state reaches {largest:.3g}, beyond float16's range: store the features with "
                    "--dtype bfloat16."
                )
        for i, row in enumerate(batch):
            n, piece = lengths[i], encoded[where[i]]
            piece["input_ids"] = ids[i, :n].to(torch.int32)
            piece["loss_mask"] = torch.as_tensor(row["loss_mask"], dtype=torch.int8)
            piece["features"] = states.features[i, :n].to(dtype).cpu()
            if top_k:
                log_probs = torch.log_softmax(target_logits(target, states.last_hidden_state[i, :n]), dim=-1)
                values, indices = log_probs.topk(top_k, dim=-1)
                piece["topk_ids"] = indices.to(torch.int32).cpu()
                piece["topk_logprobs"] = values.to(dtype).cpu()
    lengths = torch.tensor([0] + [piece["input_ids"].shape[0] for piece in encoded], dtype=torch.int64)
    tensors = {key: torch.cat([piece[key] for piece in encoded]).contiguous() for key in keys}
    tensors["offsets"] = torch.cumsum(lengths, 0)
    return tensors


def build_features(config: FeatureBuildConfig, target=None, rows=None, progress: bool = True) -> dict:
    """Build (or resume) a feature store; returns its manifest. `target` and `rows` may be passed in directly. With
    `num_threads`, torch runs that many threads while it builds, and the caller's number again after."""
    if config.shard_rows < 1 or config.batch_size < 1:
        raise FeatureStoreError("--shard_rows and --batch_size must be at least 1.")
    if config.top_k < 0:
        raise FeatureStoreError(f"--top_k must be 0 (none) or positive, got {config.top_k}.")
    previous = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        return _build_features(config, target, rows, progress)
    finally:
        torch.set_num_threads(previous)


def _build_features(config: FeatureBuildConfig, target, rows, progress: bool) -> dict:
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    if rows is None:
        rows = load_rows(config.dataset, "dataset")
    if config.max_rows is not None:
        if config.max_rows > len(rows):
            raise FeatureStoreError(f"--max_rows {config.max_rows}: the dataset has only {len(rows)} rows.")
        rows = _slice(rows, 0, config.max_rows)
    if len(rows) == 0:
        raise FeatureStoreError("The dataset is empty: nothing to encode.")
    if target is None:
        from ..targets import load_target

        target, _ = load_target(config.target, dtype=config.target_dtype)
    target.eval()
    text = target.config.get_text_config()
    check_training_dataset(rows, text.vocab_size, getattr(text, "max_position_embeddings", None), "dataset")
    layer_ids = _layer_ids(config, target.config)
    bad = [i for i in layer_ids if not 0 <= i < text.num_hidden_layers]
    if bad:
        raise FeatureStoreError(f"target_layer_ids {bad} are outside the target's {text.num_hidden_layers} layers.")

    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    settings = _settings(config, target, layer_ids, rows)
    manifest_path = out / MANIFEST
    fingerprint = fingerprint_of(settings)
    expected = shard_fingerprints(rows, config.shard_rows)  # one cheap pass over the tokens
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("settings", {}).get("format_version") != FORMAT_VERSION:
            raise FeatureStoreError(
                f"{out} holds a feature store of format {manifest.get('settings', {}).get('format_version')} (this "
                f"version writes {FORMAT_VERSION}); delete it and rerun the command to rebuild it."
            )
        if manifest.get("fingerprint") != fingerprint:
            differing = sorted(k for k in settings if manifest.get("settings", {}).get(k) != settings[k])
            raise FeatureStoreError(
                f"{out} holds features of another build (differing: {differing}). Use a new --output folder, or "
                "delete this one to rebuild it."
            )
        manifest["shards"] = _kept_shards(manifest, rows, expected, out)
    else:
        manifest = {"fingerprint": fingerprint, "settings": settings, "shards": []}

    spans = [(lo, min(len(rows), lo + config.shard_rows)) for lo in range(0, len(rows), config.shard_rows)]
    done = len(manifest["shards"])
    todo = range(done, len(spans) if config.max_shards is None else min(len(spans), done + config.max_shards))
    dtype = STORAGE_DTYPES[config.dtype]
    bar = tqdm(total=len(rows), initial=sum(s["rows"] for s in manifest["shards"]), unit="row", desc="features",
               disable=not progress)  # fmt: skip
    started = time.perf_counter()
    for index in todo:
        lo, hi = spans[index]
        shard_rows = [rows[i] for i in range(lo, hi)]
        data_fingerprint = expected[index]
        tensors = _encode_rows(target, shard_rows, layer_ids, dtype, config.top_k, config.batch_size)
        path = out / _shard_name(index)
        temporary = path.with_suffix(".tmp")
        metadata = {"fingerprint": fingerprint, "data_fingerprint": data_fingerprint, "first_row": str(lo)}
        save_file(tensors, str(temporary), metadata=metadata)
        os.replace(temporary, path)
        manifest["shards"].append({"file": path.name, "rows": hi - lo, "tokens": int(tensors["offsets"][-1]),
                                   "bytes": path.stat().st_size, "data_fingerprint": data_fingerprint})  # fmt: skip
        _update_progress(manifest, len(spans))
        _write_manifest(manifest_path, manifest)
        bar.update(hi - lo)
    bar.close()
    _update_progress(manifest, len(spans))
    tokens = sum(s["tokens"] for s in manifest["shards"])
    manifest["summary"] = {
        "rows": sum(s["rows"] for s in manifest["shards"]),
        "tokens": tokens,
        "bytes": sum(s["bytes"] for s in manifest["shards"]),
        "bytes_per_token": round(sum(s["bytes"] for s in manifest["shards"]) / max(1, tokens), 1),
        "seconds_this_run": round(time.perf_counter() - started, 2),
    }
    _write_manifest(manifest_path, manifest)
    return manifest


def _layer_ids(config: FeatureBuildConfig, target_config) -> list[int]:
    if config.target_layer_ids:
        return [int(i) for i in config.target_layer_ids]
    if config.drafter:
        from ..configuration_carryover import CarryoverDrafterConfig

        return list(CarryoverDrafterConfig.from_pretrained(config.drafter).target_layer_ids)
    if target_config is None:
        return []
    from ..configuration_carryover import default_target_layer_ids

    return default_target_layer_ids(target_config.get_text_config().num_hidden_layers, config.num_layer_ids)


def _update_progress(manifest: dict, num_shards: int) -> None:
    """How far the build got: rows stored, their fingerprint, and whether they are the whole dataset."""
    manifest["num_rows"] = sum(shard["rows"] for shard in manifest["shards"])
    manifest["data_fingerprint"] = _combined([shard["data_fingerprint"] for shard in manifest["shards"]])
    manifest["complete"] = len(manifest["shards"]) == num_shards


def _write_manifest(path: Path, manifest: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, path)


# -- reading ------------------------------------------------------------------------------------------------------
class FeatureStore(torch.utils.data.Dataset):
    """The rows of finished feature stores, read lazily (only the bytes of a row asked for).

    `FeatureStore(DIR)` reads one store; `FeatureStore([DIR_A, DIR_B, ...])` reads several stores of the same build
    (same settings and target) as one, their rows one after the other: a training set made of several sources, each
    store growing with its own source. Opening checks every manifest and every shard (present, of the recorded size,
    readable header, same fingerprint), so a damaged store fails before any training step.
    `check_compatible(layer_ids, target, dataset)` checks that the stores were made for this drafter's layer ids and
    this target (and the dataset's rows, in order).
    """

    def __init__(self, path: str | os.PathLike | list, allow_incomplete: bool = False):
        paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
        if not paths:
            raise FeatureStoreError("FeatureStore needs at least one store folder.")
        self.path = paths[0] if len(paths) == 1 else Path(",".join(str(p) for p in paths))  # for messages
        self.parts: list[tuple[Path, dict]] = []  # (folder, manifest) per store, in row order
        self._shards, starts = [], [0]
        for folder in paths:
            manifest = self._open_manifest(folder, allow_incomplete)
            if self.parts and manifest["fingerprint"] != self.parts[0][1]["fingerprint"]:
                raise FeatureStoreError(f"{folder} was built with other settings than {self.parts[0][0]}; stores read "
                                        "together must share target, layers, dtype, top-k and shard size.")  # fmt: skip
            self.parts.append((folder, manifest))
            for file, rows in self._checked_shards(folder, manifest):
                self._shards.append(file)
                starts.append(starts[-1] + rows)
        self.manifest = self.parts[0][1]
        self.settings = self.manifest["settings"]
        self._starts = np.asarray(starts)
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}
        self._limit: int | None = None

    @staticmethod
    def _open_manifest(folder: Path, allow_incomplete: bool) -> dict:
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file():
            raise FeatureStoreError(f"{folder} is not a feature store (no {MANIFEST}); build one with `carryover-hf features`.")
        manifest = json.loads(manifest_path.read_text())
        version = manifest.get("settings", {}).get("format_version")
        if version != FORMAT_VERSION:
            raise FeatureStoreError(f"{folder}: feature store format {version} is not supported (expected {FORMAT_VERSION}); rebuild it.")
        if not manifest.get("complete") and not allow_incomplete:
            raise FeatureStoreError(
                f"{folder} is unfinished ({len(manifest['shards'])} shards written): rerun the same "
                "`carryover-hf features` command to complete it."
            )
        return manifest

    @staticmethod
    def _checked_shards(folder: Path, manifest: dict):
        """(file, rows) of each shard of one store, after checking it is there, whole and of this build."""
        from safetensors import safe_open

        for shard in manifest["shards"]:
            file = folder / shard["file"]
            if not file.is_file():
                raise FeatureStoreError(f"{folder}: shard {shard['file']} is missing; rebuild the store (delete it and rerun `carryover-hf features`).")
            size = file.stat().st_size
            if size != shard["bytes"]:
                raise FeatureStoreError(
                    f"{folder}: shard {shard['file']} has {size} bytes, the manifest records {shard['bytes']} "
                    "(truncated or replaced); delete it and rerun `carryover-hf features` to rewrite it."
                )
            try:
                with safe_open(str(file), framework="pt") as handle:
                    metadata = handle.metadata() or {}
            except Exception as error:  # safetensors raises its own error types for bad headers
                raise FeatureStoreError(f"{folder}: shard {shard['file']} is unreadable ({error}).") from error
            if (metadata.get("fingerprint"), metadata.get("data_fingerprint")) != (manifest["fingerprint"], shard["data_fingerprint"]):
                raise FeatureStoreError(f"{folder}: shard {shard['file']} belongs to another build (fingerprint).")
            yield file, shard["rows"]

    # -- checks --------------------------------------------------------------------------------------------------
    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.settings["target_layer_ids"])

    @property
    def has_topk(self) -> bool:
        return self.settings["top_k"] > 0

    @property
    def complete(self) -> bool:
        """Whether every store read holds all of its dataset's rows (one opened with `allow_incomplete` may not)."""
        return all(manifest.get("complete") for _, manifest in self.parts)

    def built_by(self, target) -> bool:
        """Whether `target` computed these features: the same model, or the same weights run in another dtype (a
        store built in bfloat16 on a CPU that computes it natively trains drafters for the float32 target; its
        settings' `target_dtype` says which)."""
        if target_fingerprint(target) == self.settings["target_fingerprint"]:
            return True
        return self.settings.get("target_weights_fingerprint") == weights_fingerprint(target)

    def check_compatible(self, target_layer_ids=None, target=None, dataset=None) -> None:
        """Raises if the store does not fit the drafter's layer ids, the target (fingerprint) or the dataset; checks
        only what is given."""
        if target_layer_ids is not None and list(target_layer_ids) != self.target_layer_ids:
            raise FeatureStoreError(
                f"{self.path} stores target layers {self.target_layer_ids}, the drafter reads "
                f"{list(target_layer_ids)}: build features for these layers "
                "(`carryover-hf features --target_layer_ids ...`) or train a drafter with the store's layers."
            )
        if target is not None and not self.built_by(target):
            raise FeatureStoreError(
                f"{self.path} was built with another target (or other weights) than the one given "
                f"({target.config._name_or_path!r}); rebuild the features with this target."
            )
        if dataset is not None:
            stored, given, lo = [], [], 0
            for _, manifest in self.parts:  # each store fingerprints its own rows from its first
                rows = sum(shard["rows"] for shard in manifest["shards"])
                stored += [shard["data_fingerprint"] for shard in manifest["shards"]]
                given += shard_fingerprints(_slice(dataset, lo, min(len(dataset), lo + rows)), self.settings["shard_rows"])
                lo += rows
            if lo != len(dataset) or given != stored:
                raise FeatureStoreError(
                    f"{self.path} was built from other data than the --dataset given ({len(dataset)} rows; the store "
                    f"holds {len(self)}): rerun `carryover-hf features` with this dataset to bring the store up to date."
                )

    # -- rows ----------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._starts[-1]) if self._limit is None else self._limit

    def _handle(self, shard: int):
        from safetensors import safe_open

        if shard not in self._handles:
            handle = safe_open(str(self._shards[shard]), framework="pt")
            self._handles[shard] = handle
            self._offsets[shard] = handle.get_tensor("offsets")
        return self._handles[shard]

    def _span(self, index: int):
        """The open shard holding row `index`, and the row's token range in it."""
        shard = int(np.searchsorted(self._starts, index, side="right") - 1)
        handle, offsets = self._handle(shard), self._offsets[shard]
        local = index - int(self._starts[shard])
        return handle, int(offsets[local]), int(offsets[local + 1])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside the store's {len(self)} rows")
        handle, lo, hi = self._span(index)
        row = {
            "input_ids": handle.get_slice("input_ids")[lo:hi].long(),
            "loss_mask": handle.get_slice("loss_mask")[lo:hi].long(),
            "target_features": handle.get_slice("features")[lo:hi],
        }
        if self.has_topk:
            row["target_topk_ids"] = handle.get_slice("topk_ids")[lo:hi].long()
            row["target_topk_logprobs"] = handle.get_slice("topk_logprobs")[lo:hi]
        return row

    def token_rows(self):
        """Rows with `input_ids` and `loss_mask` only (no feature bytes are read)."""
        for index in range(len(self)):
            handle, lo, hi = self._span(index)
            yield {"input_ids": handle.get_slice("input_ids")[lo:hi], "loss_mask": handle.get_slice("loss_mask")[lo:hi]}

    def row_lengths(self) -> list[int]:
        """Tokens per row, from the shards' offsets alone (for length-grouped batches; no row is read)."""
        lengths = []
        for shard in range(len(self._shards)):
            self._handle(shard)
            lengths.extend(self._offsets[shard].diff().tolist())
        return lengths[: len(self)]

    def head(self, num_rows: int) -> "FeatureStore":
        """The same store limited to its first `num_rows` rows (what `--max_train_samples` selects)."""
        if not 1 <= num_rows <= len(self):
            raise FeatureStoreError(f"{self.path} has {len(self)} rows; cannot take the first {num_rows}.")
        limited = object.__new__(FeatureStore)
        limited.__dict__.update(self.__getstate__())
        limited._limit = num_rows
        return limited

    def __getstate__(self):  # safetensors handles do not pickle (dataloader workers reopen them)
        state = dict(self.__dict__)
        state["_handles"], state["_offsets"] = {}, {}
        return state


def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(FeatureBuildConfig, prog="carryover-hf features", description=__doc__.split("\n\n")[0])
    (config,) = parser.parse_args_into_dataclasses(args=argv)
    if config.dataset is None:
        print("carryover-hf features: --dataset is required (the training rows to encode).", file=sys.stderr)
        return 2
    try:
        manifest = build_features(config)
    except (FeatureStoreError, FileNotFoundError) as error:
        print(f"carryover-hf features: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"complete": manifest["complete"], **manifest["summary"], "fingerprint": manifest["fingerprint"]}, indent=2))
    return 0


__all__ = [
    "FeatureBuildConfig",
    "FeatureStore",
    "FeatureStoreError",
    "build_features",
    "dataset_fingerprint",
    "shard_fingerprints",
    "target_fingerprint",
]
