"""`carryover-hf campaign`: a drafter training campaign that outlives sessions.

One command starts it or resumes it in the background at a fixed thread count; its whole state lives in one folder
outside the work tree (default `../runs/campaign`), which the next session on the same machine finds again:

    carryover-hf campaign start  [--dir DIR] [--config FILE.json]   # start or resume, in the background
    carryover-hf campaign start  --config FILE.json --from EXPORT   # go on from a committed milestone elsewhere
    carryover-hf campaign start  ... --build_threads 2               # build the feature stores on 2 threads, train on 1
    carryover-hf campaign status [--dir DIR]                        # running or not, the last curve points
    carryover-hf campaign stop   [--dir DIR]                        # checkpoint at the next step, then exit
    carryover-hf campaign report [--dir DIR] --out RESULTS [--weights FOLDER]  # curve JSON + table + plot to commit
    carryover-hf campaign run    [--dir DIR]                        # the loop itself, in the foreground

The loop (`run`) does, each time it starts:

1. **Data.** Builds or extends the offline feature stores of the campaign's regenerated rows: one training store
   per dataset (`features-train/`, `features-train-1/`, ...) and `features-eval/`
   (`carryover_hf.training.feature_store.build_features`: resumable shard by shard, fingerprinted; a grown
   regeneration run only adds shards to its own store). The held-out rows never enter a training store.
2. **Training.** Continues the trunk (`trunk/`, a `CarryoverTrainer` run with a constant learning rate after its
   warm-up) from its last checkpoint: weights, optimizer, scheduler, data order, anchors and RNG are restored, so a run
   stopped and resumed takes the same steps as one that never stopped. The held-out teacher-forced tau is evaluated
   every `eval_steps`; every log entry records the training core-hours spent so far (CPU time of the training
   process, summed over every session; milestone benchmarks excluded).
3. **Milestones** at each doubling of compute (`first_milestone_core_hours` x 1, 2, 4, ...): a decay branch continues
   the trunk's checkpoint for a tenth of its steps with the learning rate annealed to 0 (the trunk itself goes on
   unchanged); its weights are saved under `milestones/` (safetensors) with their held-out tau and, unless
   `milestone_prompts_per_category` is 0, benchmarked as the drafter alone (carry off, no lookup, no backoff) against
   the target alone on held-out prompts of the eval split, at each of `milestone_temperatures`, in the same process
   and thread (`carryover_hf.tools.bench.run_benchmark`).
4. **Carryover on the curve** (`carry_steps` > 0): from each milestone, a carryover branch and its step-matched
   continued baseline (`compare_carryover`), benchmarked against each other and probed for the carry rows' attention
   share; a comparison a stop cut short, or the newest milestone's when `carry_steps` is first set, is taken when the
   loop starts, before the trunk goes on.

`report` turns the trunk's log history and the milestones into `curve.json`, `curve.md` and `curve.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import UsageError

DEFAULT_DIR = "../runs/campaign"
CONFIG_FILE = "campaign.json"
PID_FILE = "campaign.pid"
LOG_FILE = "campaign.log"
MILESTONES_FILE = "milestones.json"
CHECKPOINT_STATE = "campaign_state.json"
EXPORT_STATE = "campaign_state.json"  # beside an exported milestone: what a campaign moved to another machine needs
INHERITED_CURVE = "inherited_curve.json"  # a moved campaign's curve points from the machines before
CURVE_POINTS = ("eval", "validation", "train", "recipe_changes")  # `curve`'s lists, each item with its core-hours
TRUNK = "trunk"
CARRY = "carry"  # in a milestone's folder: its carryover comparison
TAU_NOTE = (
    "Held-out τ, teacher-forced: 1 + leading correct drafts, averaged over anchors drawn uniformly from the held-out "
    "responses (the training metric). Decoding: full-block greedy decoding replayed on the same rows, over the first "
    "{tokens} tokens of each response (`carryover_hf.training.replay`): the drafter-alone acceptance length of a "
    "generate call on them. It is the lower one wherever acceptance varies along a response: decoding meets a hard "
    "stretch once per token and an easy one once per long round. At T = 1 (from 2026-12-07): the expected acceptance "
    "length of drafts sampled from the drafter, 1 + Σ_k Π_(j<=k) Σ_v min(p, q) at the held-out anchors, p the "
    "target's stored top-k, teacher-forced like the first column."
)
BRANCH_RECORD = "branch.json"
# Settings a resume may change. The carry settings only shape the carryover comparisons taken from milestones; the
# loss settings change the trunk's objective from its next step on (its weights and optimizer go on as they are), and
# their change is recorded with that trunk step, so the curve shows where the recipe changed.
# The validation settings only add measurements (a validation set may be added once, its cadence changed any time).
CARRY_CHANGES = ("carry_steps", "carry_learning_rate", "carry_num_anchors", "carry_plain_weight")
LOSS_CHANGES = ("distillation", "distillation_weight", "cpu_autocast")  # how the trunk's steps compute their loss
VALIDATION_CHANGES = ("validation_dataset", "validation_steps")
BUILD_CHANGES = ("build_passes", "build_slice_shards")  # only when the stores' shards are built, not what they hold
RESUMABLE_CHANGES = CARRY_CHANGES + LOSS_CHANGES + VALIDATION_CHANGES + BUILD_CHANGES
VALIDATION = "validation"  # the validation set's store folder suffix, metric prefix (`eval_validation_*`) and keys


@dataclass
class CampaignConfig:
    """What a campaign trains and how; fixed when it starts (a resumed campaign must be given the same or nothing)."""

    name: str = "smollm2-135m-markov-b8"
    target: str = "smollm2-135m"
    target_dtype: str = "float32"
    # Regeneration runs (or any `carryover-hf train --dataset` source), read one after the other.
    datasets: list[str] = field(default_factory=lambda: ["assets/train/smollm2-135m"])
    # Rows [start, stop) of the concatenated datasets that are held out for the teacher-forced tau (never trained on).
    held_out_rows: list[int] = field(default_factory=lambda: [230, 256])
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 8, 14, 20, 27])
    feature_dtype: str = "bfloat16"
    top_k: int = 32
    feature_shard_rows: int = 16
    feature_batch_size: int = 2
    # The dtype the target runs in while it builds the stores (None: target_dtype). "auto": bfloat16 on a CPU that
    # computes it natively (AVX-512 BF16 or AMX: 2.6x faster there, features within ~1 % of float32's), else
    # target_dtype. Training and milestones always use the target in target_dtype.
    feature_target_dtype: str | None = None
    # While the training stores are incomplete (a new campaign, or one moved to a machine without its stores), the
    # trunk trains on the rows built so far: each leg builds `build_slice_shards` more shards of every training store,
    # then trains on build_passes times as many rows as the slice added, drawn from every row built so far (1.0: as
    # many row reads as an on-the-fly first epoch). None: build everything first.
    build_passes: float | None = None
    build_slice_shards: int = 8
    # The drafter.
    drafter_type: str = "markov"
    drafter_layers: int = 1
    block_size: int = 8
    draft_vocab_size: int | None = 8192
    init_from_target: bool = True
    # Optimisation (a constant rate after the warm-up: the trunk can go on for as long as compute is given).
    learning_rate: float = 1.5e-3
    warmup_steps: int = 20
    per_device_train_batch_size: int = 4
    num_anchors: int = 64
    distillation: str | None = "kl"
    distillation_weight: float = 0.5
    seed: int = 0
    threads: int = 1
    # The training steps' CPU autocast (`CarryoverTrainingArguments.cpu_autocast`): "auto" runs them in bfloat16 where
    # the CPU computes it natively (2.18x faster a step on an AMD EPYC with AVX-512 BF16, the same validation tau after
    # 200 steps); evaluation stays float32. A resume may change it; the change is recorded with the trunk's step.
    cpu_autocast: str | None = None
    save_steps: int = 100
    eval_steps: int = 200
    logging_steps: int = 25
    # Milestones at first_milestone_core_hours * 2**k training core-hours of the trunk; each continues the trunk's
    # checkpoint for max(milestone_min_decay_steps, milestone_decay_fraction * its steps) with the learning rate
    # annealed to 0 (a cosine), so a milestone is a finished drafter (0: the trunk's own weights).
    first_milestone_core_hours: float = 0.5
    milestone_decay_fraction: float = 0.1
    milestone_min_decay_steps: int = 50
    milestone_prompts: str | None = None  # a prompt suite folder or JSONL (default: the shipped suites, eval split)
    milestone_prompts_per_category: int = 2
    milestone_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    milestone_max_new_tokens: int = 128
    # Carryover on the curve: from each milestone, two branches of carry_steps steps on the same batches and anchors,
    # one with the carryover objective, one with the dflash objective (the step-matched continued baseline), each with
    # a 10 % warm-up and a cosine to 0 from carry_learning_rate; then both benchmarked on the milestone's prompts
    # (carryover with carry on against the continued baseline with carry off and on) and probed for the attention
    # share on carry rows. 0: no comparison. carry_plain_weight: the carryover branch's loss adds this times the dflash
    # loss of its first draft (`carryover_plain_weight`), so its plain draft keeps training as the baseline's does.
    # These settings never touch the trunk, so a resume may change them.
    carry_steps: int = 0
    carry_learning_rate: float = 3e-4
    carry_num_anchors: int = 16
    carry_plain_weight: float = 0.0
    # A validation set beside the benchmark's prompts: a regenerated dataset of the target's greedy responses to
    # eval-split prompts the benchmark leaves out (`carryover-hf regenerate --split eval --skip_per_category 20
    # --limit_per_category 20 --max_new_tokens 128`: the next 20 of each category). All its rows are evaluated (held-out
    # metrics with prefix `eval_validation_`; the decoding replay there is the drafter-alone tau of full-block greedy
    # `generate` on those prompts) every `validation_steps` trunk steps and at each milestone, outside the training
    # core-hours. None: no validation set.
    validation_dataset: str | None = None
    validation_steps: int = 1000

    def validate(self) -> None:
        if self.drafter_type not in ("dflash", "markov"):
            raise UsageError(f"drafter_type must be 'dflash' or 'markov', got {self.drafter_type!r}.")
        if not self.datasets:
            raise UsageError("datasets is empty: give at least one regeneration run.")
        if len(self.held_out_rows) != 2 or not 0 <= self.held_out_rows[0] < self.held_out_rows[1]:
            raise UsageError(f"held_out_rows must be [start, stop) with 0 <= start < stop, got {self.held_out_rows}.")
        for name in ("threads", "save_steps", "eval_steps", "logging_steps", "block_size", "drafter_layers",
                     "per_device_train_batch_size", "num_anchors"):  # fmt: skip
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.first_milestone_core_hours <= 0:
            raise UsageError(f"first_milestone_core_hours must be positive, got {self.first_milestone_core_hours}.")
        if not 0 <= self.milestone_decay_fraction < 1 or self.milestone_min_decay_steps < 0:
            raise UsageError("milestone_decay_fraction must lie in [0, 1) and milestone_min_decay_steps be >= 0.")
        if self.milestone_prompts_per_category < 0:
            raise UsageError("milestone_prompts_per_category must be 0 (no benchmark) or more.")
        if self.carry_steps < 0 or self.carry_num_anchors < 1 or self.carry_learning_rate <= 0 or self.carry_plain_weight < 0:
            raise UsageError("carry_steps must be >= 0, carry_num_anchors >= 1, carry_learning_rate positive and "
                             "carry_plain_weight >= 0.")  # fmt: skip
        if self.validation_steps < 1:
            raise UsageError(f"validation_steps must be at least 1, got {self.validation_steps}.")
        if self.feature_target_dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise UsageError("feature_target_dtype must be null, 'auto', 'float32', 'bfloat16' or 'float16', got "
                             f"{self.feature_target_dtype!r}.")  # fmt: skip
        if (self.build_passes is not None and self.build_passes <= 0) or self.build_slice_shards < 1:
            raise UsageError(f"build_passes must be positive (or null) and build_slice_shards at least 1, got "
                             f"{self.build_passes} and {self.build_slice_shards}.")  # fmt: skip
        if self.carry_steps and not self.milestone_prompts_per_category:
            raise UsageError("carry_steps needs milestone_prompts_per_category >= 1: the comparison is benchmarked.")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "CampaignConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UsageError(f"unknown campaign settings {unknown}; known: {sorted(known)}.")
        return cls(**values)


# -- the campaign folder ----------------------------------------------------------------------------------------------
class Campaign:
    """A campaign folder: its config, its stores, its trunk, its milestones; the process that runs it, if any."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory).resolve()

    @property
    def config_path(self) -> Path:
        return self.dir / CONFIG_FILE

    def exists(self) -> bool:
        return self.config_path.is_file()

    def record(self) -> dict:
        """What `campaign.json` holds: the config and what happened to it on this machine (settings changed on
        resumes, the export it was seeded from, the stores' build order); empty before the first start."""
        return json.loads(self.config_path.read_text()) if self.exists() else {}

    def _update_record(self, **fields) -> None:
        """Sets `fields` in `campaign.json`, keeping the rest (the only writer after the first start)."""
        _write_json(self.config_path, {**self.record(), **fields})

    def load_config(self) -> CampaignConfig:
        if not self.exists():
            raise UsageError(f"no campaign in {self.dir} (no {CONFIG_FILE}); start one with `carryover-hf campaign start`.")
        return CampaignConfig.from_dict(self.record()["config"])

    def create_or_check(self, config: CampaignConfig | None) -> CampaignConfig:
        """The campaign's config: written on the first start (dataset paths made absolute), checked on a resume."""
        if self.exists():
            saved = self.load_config()
            if config is not None and _absolute(config) != saved:
                changed = sorted(k for k, v in asdict(_absolute(config)).items() if asdict(saved)[k] != v)
                fixed = [k for k in changed if k not in RESUMABLE_CHANGES]
                if "validation_dataset" in changed and saved.validation_dataset is not None:
                    fixed.append("validation_dataset (it may be added, not replaced: its curve would mix two sets)")
                if fixed:
                    raise UsageError(
                        f"{self.dir} holds a campaign with other settings ({', '.join(fixed)}); resume it without "
                        f"--config, or start another in a new --dir (only {', '.join(RESUMABLE_CHANGES)} may change)."
                    )
                config = _absolute(config)
                config.validate()
                _check_datasets(config)
                change = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": changed,
                          "from": {k: asdict(saved)[k] for k in changed}, "to": {k: asdict(config)[k] for k in changed}}  # fmt: skip
                if any(k in LOSS_CHANGES for k in changed):
                    change["trunk_step"] = self.trunk_step()  # the new loss trains the steps after this one
                self._update_record(config=asdict(config), changes=self.record().get("changes", []) + [change])
                print(f"campaign {config.name}: settings changed on resume: {', '.join(changed)}")
                return config
            return saved
        config = _absolute(config or CampaignConfig())
        config.validate()
        _check_datasets(config)
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.config_path, {"config": asdict(config), "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
        return config

    def last_checkpoint(self) -> str | None:
        """The trunk's last checkpoint folder, if it has one."""
        from transformers.trainer_utils import get_last_checkpoint

        trunk = self.dir / TRUNK
        return get_last_checkpoint(str(trunk)) if trunk.is_dir() else None

    def trunk_step(self) -> int:
        """The step of the trunk's last checkpoint (0 before the first)."""
        last = self.last_checkpoint()
        return int(Path(last).name.rsplit("-", 1)[1]) if last else 0

    def recipe_changes(self) -> list[dict]:
        """The changes of the trunk's loss settings made on resumes, each with the trunk step it took effect after."""
        return [c for c in self.record().get("changes", []) if "trunk_step" in c]

    def seed(self) -> dict | None:
        """Where the trunk started from when the campaign was moved to this machine (`start --from`), if it was."""
        return self.record().get("seed")

    def seed_from(self, export: Path, config: CampaignConfig) -> None:
        """Starts this (new) campaign's trunk from an exported milestone (`report --weights`): its weights, with a
        fresh optimizer; its core-hours and milestones carry over, so the curve and the doublings go on."""
        state = read_export(export, config)
        seed = {"from": str(export.resolve()), "core_hours": state["core_hours"],
                "milestones": len(state["milestones"]), "source": state.get("source", "milestone"),
                "trunk_step": state["trunk_step"] if "trunk_step" in state else state["milestones"][-1]["step"]}  # fmt: skip
        order = {name: {"start": start} for name, start in (state.get("next_build_start") or {}).items()}
        self._update_record(seed=seed, **({"build_order": order} if order else {}))
        if state.get("curve"):  # the trunk's points up to where the export branched off it
            trunk = state.get("source") == "trunk"
            self.inherit_curve(state["curve"], state["core_hours"] if trunk else state["milestones"][-1]["core_hours"])
        for milestone in state["milestones"]:
            self.add_milestone({**milestone, "inherited_from": str(export.resolve())})

    def build_order(self) -> dict[str, dict[str, int]]:
        """Where each training store's build starts in its dataset (`{store: {"start": s, "rows": n}}`: rows s..n-1,
        then 0..s-1, then any rows the dataset gained): a moved campaign builds first the rows the last machine did not
        reach (`next_build_starts`), so that a build cut short by the end of a session does not favour the same rows
        on every machine. Empty: every store from its first row."""
        return self.record().get("build_order", {})

    def set_build_order(self, order: dict[str, dict[str, int]]) -> None:
        self._update_record(build_order=order)

    def inherit_curve(self, points: dict[str, list[dict]], up_to_core_hours: float) -> None:
        """Keeps the curve's points of the machines before this one (`report`'s "eval", "validation" and "train"
        lists and its recipe changes, up to the core-hours the trunk goes on from), so that `report` draws the whole
        curve here."""
        kept = {key: [p for p in points.get(key, []) if (p.get("core_hours") or 0) <= up_to_core_hours + 1e-9]
                for key in CURVE_POINTS}  # fmt: skip
        _write_json(self.dir / INHERITED_CURVE, kept)

    def inherited_curve(self) -> dict[str, list[dict]]:
        path = self.dir / INHERITED_CURVE
        stored = json.loads(path.read_text()) if path.is_file() else {}
        return {key: stored.get(key, []) for key in CURVE_POINTS}

    def running_pid(self) -> int | None:
        """The pid of the process running this campaign, if it is alive."""
        path = self.dir / PID_FILE
        if not path.is_file():
            return None
        try:
            pid = int(path.read_text().strip())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            return None
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"campaign" not in cmdline.read_bytes():
            return None  # the pid was reused by another program
        return pid

    def milestones(self) -> list[dict]:
        path = self.dir / MILESTONES_FILE
        return json.loads(path.read_text()) if path.is_file() else []

    def add_milestone(self, record: dict) -> None:
        records = [m for m in self.milestones() if m["index"] != record["index"]] + [record]
        _write_json(self.dir / MILESTONES_FILE, sorted(records, key=lambda m: m["index"]))

    def log_history(self) -> list[dict]:
        """The trunk's log entries (its newest trainer state: the run folder's, or its last checkpoint's)."""
        candidates = [self.dir / TRUNK / "trainer_state.json"]
        last = self.last_checkpoint()
        if last:
            candidates.append(Path(last) / "trainer_state.json")
        states = [json.loads(p.read_text()) for p in candidates if p.is_file()]
        return max(states, key=lambda s: s["global_step"])["log_history"] if states else []


def read_export(export: Path, config: CampaignConfig) -> dict:
    """The state of an exported milestone (`report --weights`), checked against the campaign it is to seed."""
    state_path = export / EXPORT_STATE
    if not state_path.is_file() or not (export / "model.safetensors").is_file():
        raise UsageError(f"--from {export}: no {EXPORT_STATE} and model.safetensors there (write them with "
                         "`carryover-hf campaign report --weights`).")  # fmt: skip
    state = json.loads(state_path.read_text())
    exported = json.loads((export / "config.json").read_text())
    wanted = {"drafter_type": config.drafter_type, "num_hidden_layers": config.drafter_layers,
              "block_size": config.block_size, "draft_vocab_size": config.draft_vocab_size,
              "target_layer_ids": config.target_layer_ids}  # fmt: skip
    different = sorted(k for k, v in wanted.items() if exported.get(k) != v)
    if different:
        raise UsageError(f"--from {export}: the exported drafter differs from the campaign's settings in {different}.")
    return state


def _absolute(config: CampaignConfig) -> CampaignConfig:
    values = asdict(config)
    values["datasets"] = [str(Path(d).resolve()) for d in config.datasets]
    for key in ("milestone_prompts", "validation_dataset"):
        if values[key]:
            values[key] = str(Path(values[key]).resolve())
    return CampaignConfig(**values)


def _check_datasets(config: CampaignConfig) -> None:
    missing = [d for d in config.datasets + [config.validation_dataset] if d is not None and not Path(d).exists()]
    if missing:
        raise UsageError(f"datasets {missing} do not exist.")


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)


def milestone_core_hours(config: CampaignConfig, index: int) -> float:
    """Training core-hours at which milestone `index` (0, 1, 2, ...) is taken: each doubles the one before."""
    return config.first_milestone_core_hours * 2**index


# -- step 1: data -----------------------------------------------------------------------------------------------------
def split_held_out(rows, held_out: range):
    """(training row indices, held-out row indices) of a dataset: the rows outside `held_out`, in order, except rows
    that answer a held-out prompt again (same `id`, e.g. a sampled run over the same prompts); and the rows inside."""
    if len(rows) < held_out.stop:
        raise UsageError(f"the campaign's datasets have {len(rows)} rows; the held-out rows {held_out.start}-"
                         f"{held_out.stop - 1} need more.")  # fmt: skip
    ids = rows["id"] if "id" in rows.column_names else None
    held_out_ids = {ids[i] for i in held_out} if ids is not None else set()
    kept = [i for i in range(len(rows)) if i not in held_out and (ids is None or ids[i] not in held_out_ids)]
    dropped = len(rows) - len(held_out) - len(kept)
    if dropped:
        print(f"campaign: {dropped} training row(s) answer a held-out prompt again and are left out", flush=True)
    return kept, list(held_out)


def train_store_names(count: int) -> list[str]:
    """The training stores' folders, one per dataset (`features-train`, `features-train-1`, ...)."""
    return ["features-train"] + [f"features-train-{k}" for k in range(1, count)]


def store_rows(config: CampaignConfig, order: dict[str, dict[str, int]] | None = None) -> dict[str, list[tuple[str, Any, list[int]]]]:
    """What each store holds: per kind ("eval", "train", "validation"), its stores' (folder name, rows, indices), the
    training stores' indices in their `build_order` (`Campaign.build_order`, with its "rows" set)."""
    from datasets import concatenate_datasets

    from ..training.data import load_rows

    sources = [load_rows(path, "datasets") for path in config.datasets]
    rows = sources[0] if len(sources) == 1 else concatenate_datasets(sources)
    kept, held_out = split_held_out(rows, range(*config.held_out_rows))
    bounds = [0]
    for source in sources:
        bounds.append(bounds[-1] + len(source))
    parts = {"eval": [("features-eval", rows, held_out)]}
    parts["train"] = [(name, rows, [i for i in kept if bounds[k] <= i < bounds[k + 1]])
                      for k, name in enumerate(train_store_names(len(sources)))]  # fmt: skip
    for k, (name, _, indices) in enumerate(parts["train"]):
        if name in (order or {}):
            start, length = order[name]["start"], order[name]["rows"]
            parts["train"][k] = (name, rows, indices[start:length] + indices[:start] + indices[length:])
    if config.validation_dataset:
        validation = load_rows(config.validation_dataset, "validation_dataset")
        parts[VALIDATION] = [(f"features-{VALIDATION}", validation, list(range(len(validation))))]
    return parts


def settled_build_order(campaign: Campaign, config: CampaignConfig) -> dict[str, dict[str, int]]:
    """The campaign's build order with each store's "rows" fixed at the first build after a move (so rows a
    regeneration run adds later go to the end of the store, which then only grows at its end)."""
    order = campaign.build_order()
    if any("rows" not in entry for entry in order.values()):
        lengths = {name: len(indices) for name, _, indices in store_rows(config)["train"]}
        order = {name: {"start": entry["start"] % max(1, lengths[name]), "rows": lengths[name]} if "rows" not in entry
                 else entry for name, entry in order.items() if name in lengths}  # fmt: skip
        campaign.set_build_order(order)
    return order


def next_build_starts(campaign: Campaign, config: CampaignConfig) -> dict[str, int]:
    """Per training store, the dataset position of the first row its build has not reached (its start again once
    complete): where a campaign moved elsewhere begins its build (`--from`)."""
    order, starts = campaign.build_order(), {}
    for name, _, indices in store_rows(config)["train"]:
        manifest = campaign.dir / name / "features.json"
        built = json.loads(manifest.read_text())["num_rows"] if manifest.is_file() else 0
        start, length = (order[name]["start"], order[name]["rows"]) if name in order else (0, len(indices))
        starts[name] = (start + built) % length if 0 < built < length else start
    return starts


def build_stores(campaign: Campaign, config: CampaignConfig, target, progress: bool = True,
                 threads: int | None = None, train_shards: int | None = None) -> dict[str, list[Path]]:  # fmt: skip
    """Builds or extends the held-out store and one training store per dataset; returns their folders. `threads`:
    torch threads for the target's forwards (default: the campaign's own). `train_shards`: add at most that many
    shards to each training store (a slice of a build the trunk trains beside; `FeatureStore.complete` tells when
    it is done); the held-out and validation stores are always built whole.

    Each dataset has its own training store so that every store only ever grows at its end: a regeneration run that
    gains chunks adds shards to its own store and leaves the stores of the datasets after it as they are."""
    from ..training.feature_store import FeatureBuildConfig, build_features

    stores: dict[str, list[Path]] = {}
    for kind, folders in store_rows(config, settled_build_order(campaign, config)).items():
        for name, source, indices in folders:
            folder = campaign.dir / name
            build = FeatureBuildConfig(
                output=str(folder), target=config.target,
                target_layer_ids=config.target_layer_ids, dtype=config.feature_dtype, top_k=config.top_k,
                shard_rows=config.feature_shard_rows, batch_size=config.feature_batch_size, num_threads=threads or config.threads,
                target_dtype=str(next(target.parameters()).dtype).removeprefix("torch."),
                max_shards=train_shards if kind == "train" else None,
            )  # fmt: skip
            manifest = build_features(build, target=target, rows=source.select(indices), progress=progress)
            status = "" if manifest["complete"] else f" of {len(indices)} (building)"
            print(f"campaign: {name}: {manifest['num_rows']} rows{status}, {manifest['summary']['tokens']} tokens",
                  flush=True)  # fmt: skip
            stores.setdefault(kind, []).append(folder)
    return stores


def feature_target(config: CampaignConfig, target):
    """The target that builds the feature stores: `target` itself, or a copy in `feature_target_dtype` ("auto":
    bfloat16 where this CPU computes it natively)."""
    import copy

    import torch

    from ..utils import resolve_auto_bfloat16

    wanted = resolve_auto_bfloat16(config.feature_target_dtype)
    dtype = getattr(torch, wanted) if wanted else None
    if dtype is None or dtype == next(target.parameters()).dtype:
        return target
    return copy.deepcopy(target).to(dtype)


# -- step 2: training -------------------------------------------------------------------------------------------------
def training_arguments(config: CampaignConfig, output_dir: Path, **overrides):
    """The trunk's `CarryoverTrainingArguments` (and, with overrides, a milestone's decay branch's)."""
    from ..training.arguments import CarryoverTrainingArguments

    values = dict(
        output_dir=str(output_dir),
        objective="dflash",
        max_steps=10**9,  # the trunk stops on compute (milestones) or on request, never on a step count
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.warmup_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_train_batch_size,
        num_anchors=config.num_anchors,
        distillation=config.distillation,
        distillation_weight=config.distillation_weight,
        cpu_autocast=config.cpu_autocast,
        train_sampling_strategy="group_by_length",
        eval_strategy="steps",
        eval_steps=config.eval_steps,
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=config.logging_steps,
        report_to="none",
        seed=config.seed,
        dataloader_num_workers=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    values.update(overrides)
    return CarryoverTrainingArguments(**values)


class CoreHours:
    """Training core-hours of the campaign: CPU time of this process spent on the trunk, added to what earlier runs
    spent (read from the checkpoint a run resumes)."""

    def __init__(self, spent_before: float = 0.0):
        self.before = spent_before
        self.started = time.process_time()

    def seconds(self) -> float:
        return self.before + time.process_time() - self.started

    def hours(self) -> float:
        return self.seconds() / 3600.0

    @contextlib.contextmanager
    def excluded(self):
        """CPU time spent inside this block (a validation evaluation) is not training time."""
        started = time.process_time()
        try:
            yield
        finally:
            self.before -= time.process_time() - started


class StopRequest:
    """Set by SIGTERM (`carryover-hf campaign stop`): the trunk checkpoints after its current step and the run ends."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum=None, frame=None) -> None:
        self.requested = True


def _trunk_callback(clock: CoreHours, milestone_at: float, stop: StopRequest, stop_after_steps: int | None,
                    leg_until: int | None = None):  # fmt: skip
    from transformers import TrainerCallback

    class TrunkCallback(TrainerCallback):
        """Core-hours on every log entry and checkpoint; a checkpoint and the end of this leg when the next milestone
        is due, when a stop is requested, at `stop_after_steps`, or at trunk step `leg_until` (the end of a leg
        beside a slice of the stores' build)."""

        milestone_due = False
        leg_over = False

        def on_step_end(self, args, state, control, **kwargs):
            if clock.hours() >= milestone_at:
                self.milestone_due = True
            if leg_until is not None and state.global_step >= leg_until:
                self.leg_over = True
            if (self.milestone_due or self.leg_over or stop.requested
                    or (stop_after_steps and state.global_step >= stop_after_steps)):  # fmt: skip
                control.should_save = True
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.log_history:
                state.log_history[-1]["core_hours"] = round(clock.hours(), 5)

        def on_save(self, args, state, control, **kwargs):
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                _write_json(checkpoint / CHECKPOINT_STATE, {"core_seconds": clock.seconds(), "step": state.global_step})

    return TrunkCallback()


def _validation_callback(trainers: "_Trainers", clock: CoreHours):
    """Evaluates the validation set every `validation_steps` trunk steps (its CPU time excluded from core-hours); the
    trunk's trainer is given to it once built (`callback.trainer = ...`)."""
    from transformers import TrainerCallback

    class ValidationCallback(TrainerCallback):
        trainer = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % trainers.config.validation_steps == 0:
                # `evaluate` clears the step's log / evaluate flags (its `on_log` and `on_evaluate`), which the flow
                # callback has just set for the trunk's own logging and held-out evaluation: they are put back.
                flags = (control.should_log, control.should_evaluate, control.should_save)
                with clock.excluded():
                    self.trainer.evaluate(trainers.validation_rows, metric_key_prefix=f"eval_{VALIDATION}")
                control.should_log, control.should_evaluate, control.should_save = flags

    return ValidationCallback()


def _core_seconds_at(checkpoint: str | None) -> float:
    if checkpoint is None:
        return 0.0
    path = Path(checkpoint) / CHECKPOINT_STATE
    if not path.is_file():
        raise UsageError(f"{checkpoint} has no {CHECKPOINT_STATE}: it was not written by a campaign.")
    return float(json.loads(path.read_text())["core_seconds"])


class _Trainers:
    """Builds the drafter and a `CarryoverTrainer` for the trunk or a decay branch, the same way every time (a
    resumed run then loads the checkpoint's weights over the new drafter)."""

    def __init__(self, config: CampaignConfig, target, tokenizer, train_rows, eval_rows, vocabulary_dir: Path,
                 seed_folder: str | None = None, validation_rows=None):  # fmt: skip
        from ..training import cli as train_cli

        self.config, self.target, self.tokenizer, self.seed_folder = config, target, tokenizer, seed_folder
        self.train_rows, self.eval_rows, self.vocabulary_dir = train_rows, eval_rows, vocabulary_dir
        self.validation_rows = validation_rows
        self.model_args = train_cli.ModelArguments(
            target=config.target, drafter_type=config.drafter_type, drafter_layers=config.drafter_layers,
            block_size=config.block_size, target_layer_ids=config.target_layer_ids,
            draft_vocab_size=config.draft_vocab_size, init_from_target=config.init_from_target,
        )  # fmt: skip

    def __call__(self, args, callbacks, weights: Path | None = None):
        """A trainer with `args`; its drafter starts from `weights` (a saved drafter folder) when given."""
        from transformers import set_seed

        from ..training import cli as train_cli
        from ..training.trainer import CarryoverTrainer

        def vocabulary(drafter):
            if self.config.draft_vocab_size:
                rows = self.train_rows
                if not rows.complete:  # a build under way: the vocabulary counts every training row, not those built
                    parts = store_rows(self.config)["train"]  # every part selects from the same rows
                    rows = parts[0][1].select([i for _, _, indices in parts for i in indices])
                train_cli._draft_vocabulary(self.model_args, drafter, rows, self.eval_rows, str(self.vocabulary_dir))

        set_seed(self.config.seed)
        start = weights if weights is not None else self.seed_folder  # else: the exported milestone of a moved campaign
        if start is not None:
            import torch

            from ..modeling_carryover import CarryoverDrafterModel

            drafter = CarryoverDrafterModel.from_pretrained(start, dtype=torch.float32)
        else:
            drafter = train_cli._build_drafter(self.model_args, self.target, self.train_rows.target_layer_ids, vocabulary)
        return CarryoverTrainer(model=drafter, target_model=self.target, args=args, train_dataset=self.train_rows,
                                eval_dataset=self.eval_rows, processing_class=self.tokenizer, callbacks=callbacks)  # fmt: skip


def run(directory: str | os.PathLike, target=None, tokenizer=None, progress: bool = True,
        stop_after_steps: int | None = None, build_threads: int | None = None) -> None:  # fmt: skip
    """The campaign loop in this process: data, then the trunk in legs from milestone to milestone, until stopped
    (SIGTERM, `carryover-hf campaign stop`) or, for tests and short runs, until the trunk reaches `stop_after_steps`
    (a checkpoint is saved there). `build_threads`: torch threads while the feature stores are built (a machine the
    campaign moved to rebuilds them all), the campaign's `threads` for the rest. With `build_passes` the trunk trains
    beside an incomplete build: legs that alternate a slice of the build with training on the rows built so far."""
    import torch

    import carryover_hf  # noqa: F401  (registers the drafter with AutoModel)

    from ..training.feature_store import FeatureStore

    campaign = Campaign(directory)
    config = campaign.load_config()
    torch.set_num_threads(config.threads)
    if target is None:
        from ..targets import load_target

        target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    builder = feature_target(config, target)
    slice_shards = config.build_slice_shards if config.build_passes else None

    def build() -> tuple[dict[str, list[Path]], float]:
        """One slice of the build (the whole of it without build_passes); its stores, and its CPU seconds."""
        started = time.process_time()
        stores = build_stores(campaign, config, builder, progress, threads=build_threads, train_shards=slice_shards)
        return stores, time.process_time() - started  # the threads are the campaign's again

    if slice_shards:  # the held-out and validation stores first, whole, so that the first leg's share is the slice's
        build_stores(campaign, config, builder, progress, threads=build_threads, train_shards=0)
    stores, build_seconds = build()
    train_rows = FeatureStore(stores["train"], allow_incomplete=True)
    growing = not train_rows.complete
    new_rows = len(train_rows) if growing else 0
    trunk = campaign.dir / TRUNK
    seed = campaign.seed()
    validation = FeatureStore(stores[VALIDATION]) if VALIDATION in stores else None
    trainers = _Trainers(config, target, tokenizer, train_rows, FeatureStore(stores["eval"]), trunk,
                         seed["from"] if seed else None, validation)  # fmt: skip
    stop = StopRequest()
    previous = signal.signal(signal.SIGTERM, stop)  # stop: checkpoint after the current step
    try:
        backfill_held_out(campaign, config, trainers)
        newest = campaign.milestones()[-1:]
        if config.carry_steps and newest and CARRY not in newest[0] and "inherited_from" not in newest[0]:
            compare_carryover(campaign, config, trainers, newest[0], stop, progress)  # taken at a restart
        while not stop.requested:
            last = campaign.last_checkpoint()
            clock = CoreHours(_core_seconds_at(last) if last or not seed else 3600.0 * seed["core_hours"])
            index = len(campaign.milestones())
            leg_until = None
            if growing:  # this leg reads build_passes times the rows the slice just built added
                steps = math.ceil(config.build_passes * new_rows / config.per_device_train_batch_size)
                leg_until = campaign.trunk_step() + max(1, steps)
            callback = _trunk_callback(clock, milestone_core_hours(config, index), stop, stop_after_steps, leg_until)
            callbacks = [callback]
            if validation is not None:
                callbacks.append(_validation_callback(trainers, clock))
            # A growing store changes the epoch's length from leg to leg: each leg starts a new pass over the rows
            # built so far (in the order the sampler draws for that epoch) instead of skipping into the last one.
            trainer = trainers(training_arguments(config, trunk, ignore_data_skip=growing), callbacks)
            for extra in callbacks[1:]:
                extra.trainer = trainer
            rows = f", {len(trainers.train_rows)} rows built so far" if growing else ""
            print(f"campaign {config.name}: {'resuming ' + Path(last).name if last else 'starting'} at "
                  f"{clock.hours():.3f} training core-hours, milestone {index} at "
                  f"{milestone_core_hours(config, index):g}{rows}", flush=True)  # fmt: skip
            trainer.train(resume_from_checkpoint=last)
            step = trainer.state.global_step
            print(f"campaign {config.name}: trunk at step {step}, {clock.hours():.3f} core-hours", flush=True)
            if callback.milestone_due:
                record = record_milestone(campaign, config, trainers, index, trunk / f"checkpoint-{step}", clock.hours(),
                                          progress)  # fmt: skip
                if config.carry_steps and not stop.requested:
                    compare_carryover(campaign, config, trainers, record, stop, progress)
            if stop.requested or (stop_after_steps and step >= stop_after_steps):
                break
            if callback.leg_over and growing:
                signal.signal(signal.SIGTERM, previous)  # a stop during a slice ends the run: its shards are atomic
                stores, build_seconds = build()
                signal.signal(signal.SIGTERM, stop)
                built_before = len(trainers.train_rows)
                trainers.train_rows = FeatureStore(stores["train"], allow_incomplete=True)
                growing = not trainers.train_rows.complete
                new_rows = len(trainers.train_rows) - built_before
                print(f"campaign {config.name}: built a slice in {build_seconds / 60:.1f} CPU minutes; "
                      f"{len(trainers.train_rows)} training rows{' so far' if growing else ', all of them'}", flush=True)  # fmt: skip
                continue
            if not callback.milestone_due:
                break
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- step 3: milestones -----------------------------------------------------------------------------------------------
def decay_steps(config: CampaignConfig, step: int) -> int:
    """Steps of a milestone's decay branch from trunk step `step` (0: the trunk's own weights are the milestone)."""
    if config.milestone_decay_fraction == 0:
        return 0
    return max(config.milestone_min_decay_steps, round(config.milestone_decay_fraction * step))


def record_milestone(campaign: Campaign, config: CampaignConfig, trainers: "_Trainers", index: int, checkpoint: Path,
                     core_hours: float, progress: bool = True) -> dict:  # fmt: skip
    """Milestone `index` from the trunk checkpoint: a decay branch (the trunk's run continued for `decay_steps` with
    the learning rate annealed to 0, as a released drafter would end), its held-out tau, its weights (safetensors)
    and, unless disabled, a benchmark of them as the drafter alone. The trunk itself is not changed."""
    import shutil

    step = int(checkpoint.name.rsplit("-", 1)[1])
    folder = campaign.dir / "milestones" / f"m{index:02d}"
    branch = folder / "decay"
    extra = decay_steps(config, step)
    started = time.process_time()
    # With no decay the branch only loads the trunk's checkpoint (max_steps = step: nothing to train).
    schedule = {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": extra}} if extra else {}
    args = training_arguments(config, branch, max_steps=step + extra, eval_strategy="no", save_strategy="no", **schedule)
    trainer = trainers(args, [])
    trainer.train(resume_from_checkpoint=str(checkpoint))
    decay_seconds = time.process_time() - started  # the decay's training only, not the evaluations after it
    evaluation = milestone_evaluation(trainer, trainers)
    trainer.save_model(str(folder))
    shutil.rmtree(branch, ignore_errors=True)
    record: dict[str, Any] = {
        "index": index, "step": step, "core_hours": round(core_hours, 5),
        "planned_core_hours": milestone_core_hours(config, index), "decay_steps": extra,
        "decay_core_hours": round(decay_seconds / 3600.0, 5),
        "final_learning_rate": trainer.lr_scheduler.get_last_lr()[0], **evaluation, "folder": str(folder),
    }  # fmt: skip
    if config.milestone_prompts_per_category:
        record["bench"] = benchmark_milestone(config, folder, trainers.target, trainers.tokenizer, progress)
    campaign.add_milestone(record)
    print(f"campaign: milestone {index} at trunk step {step} + {extra} decay steps, {core_hours:.3f} core-hours, "
          f"held-out tau {record['eval_tau']}: {record.get('bench')}", flush=True)  # fmt: skip
    return record


# A milestone's evaluation: record key -> metric of `trainer.evaluate` (prefix `eval`, or `eval_validation` on the
# validation set), each set's key prefix being the record's ("eval_", "validation_").
MILESTONE_METRICS = {"tau": "tau_teacher_forced", "tau_decoding": "tau_decoding", "tau_t1": "tau_t1_teacher_forced",
                     "loss": "loss"}  # fmt: skip


def _evaluation_sets(trainers: "_Trainers") -> dict[str, tuple[str, Any]]:
    """Record key prefix -> (metric key prefix, rows) of each set a milestone is evaluated on."""
    sets = {"eval_": ("eval", None)}  # None: the trainer's own eval_dataset (the held-out rows)
    if trainers.validation_rows is not None:
        sets[f"{VALIDATION}_"] = (f"eval_{VALIDATION}", trainers.validation_rows)
    return sets


def _expected_metrics(config: CampaignConfig) -> list[str]:
    """The metrics every set gives: tau at T = 1 only where the campaign distils (the store has the target's top-k)."""
    return [key for key in MILESTONE_METRICS if key != "tau_t1" or config.distillation]


def milestone_evaluation(trainer, trainers: "_Trainers", prefixes: list[str] | None = None) -> dict:
    """The record keys of a milestone drafter's evaluation on the held-out rows and the validation set (those of
    `prefixes` only, when given)."""
    record = {}
    for prefix, (metric_prefix, rows) in _evaluation_sets(trainers).items():
        if prefixes is not None and prefix not in prefixes:
            continue
        evaluation = trainer.evaluate(rows, metric_key_prefix=metric_prefix)
        record.update({prefix + key: evaluation.get(f"{metric_prefix}_{metric}") for key, metric in MILESTONE_METRICS.items()})
    return record


def backfill_held_out(campaign: Campaign, config: CampaignConfig, trainers: "_Trainers") -> None:
    """Milestones recorded before a metric existed (held-out decoding τ; τ at T = 1; the validation set's metrics)
    get it from their saved weights: one evaluation of each set that misses one (seconds for the held-out rows, about
    a minute for the validation set)."""
    import shutil

    scratch = campaign.dir / "backfill"
    for milestone in campaign.milestones():
        missing = [prefix for prefix in _evaluation_sets(trainers)
                   if any(milestone.get(prefix + key) is None for key in _expected_metrics(config))]  # fmt: skip
        if not missing or not (Path(milestone["folder"]) / "config.json").is_file():
            continue
        args = training_arguments(config, scratch, max_steps=1, eval_strategy="no", save_strategy="no")
        evaluation = milestone_evaluation(trainers(args, [], weights=Path(milestone["folder"])), trainers, missing)
        found = {key: value for key, value in evaluation.items() if milestone.get(key) is None}
        campaign.add_milestone({**milestone, **found})
        print(f"campaign: milestone {milestone['index']}: {found}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)


def benchmark_milestone(config: CampaignConfig, folder: Path, target, tokenizer, progress: bool = True) -> dict:
    """The milestone drafter alone (carry off, no lookup, no backoff) against the target alone, per temperature: with
    full blocks every round, and with each round's length chosen by the cost policy (`policy_alone`)."""
    report = _benchmark(config, {"drafter": folder}, ["carry_off", "policy_alone"], [], folder / "bench", target,
                        tokenizer, progress)  # fmt: skip
    return _milestone_summary(report)


def _milestone_prompts(config: CampaignConfig) -> list:
    """The held-out prompts milestones are measured on: `milestone_prompts_per_category` of each category of the eval
    split of `milestone_prompts` (default: the shipped suites)."""
    from .bench.prompts import default_suite_dir, load_prompts

    return load_prompts(config.milestone_prompts or str(default_suite_dir()), split="eval",
                        num_per_category=config.milestone_prompts_per_category)  # fmt: skip


def _benchmark(config: CampaignConfig, folders: dict[str, Path], methods: list[str], compare: list[str], output: Path,
               target, tokenizer, progress: bool) -> dict:  # fmt: skip
    """Drafters (name -> folder) as the drafter alone (every round a proposal: no lookup, no backoff) against the
    target alone on the milestone prompts, in the campaign's own process and thread, CPU kernels on where they build."""
    import copy

    from ..modeling_carryover import CarryoverDrafterModel
    from .bench.runner import BenchmarkSettings, run_benchmark
    from .cpu_kernels import apply_cpu_kernels, resolve_cpu_kernels

    prompts = _milestone_prompts(config)
    bench_target = copy.deepcopy(target).eval()
    drafters = {name: CarryoverDrafterModel.from_pretrained(folder, dtype=bench_target.dtype).eval()
                for name, folder in folders.items()}  # fmt: skip
    for drafter in drafters.values():  # methods that follow the drafter's defaults: carry only where it was trained
        drafter.generation_config.use_carryover = bool(drafter.config.trained_with_carryover)
    kernels = resolve_cpu_kernels("auto", bench_target.dtype, bench_target.device)
    if kernels:
        apply_cpu_kernels(bench_target, *drafters.values())
    settings = BenchmarkSettings(temperatures=list(config.milestone_temperatures), methods=methods, compare=compare,
                                 max_new_tokens=config.milestone_max_new_tokens, overhead=False, warmup=1,
                                 bootstrap_resamples=2000)  # fmt: skip
    # A milestone retaken after a stop measures again from scratch (overwrite): a bench cut short by the stop ran on
    # another session's machine load, and its timings are not mixed with this one's.
    return run_benchmark(bench_target, drafters, prompts, tokenizer, settings, output_dir=str(output), progress=progress,
                         native_dflash=None, run_info={"cpu_kernels": kernels}, overwrite=True)  # fmt: skip


def _milestone_summary(report: dict) -> dict:
    """Speedup and acceptance length of the drafter alone per temperature (pooled, and the mean over categories of the
    per-category speedups, as the issue's targets are stated), from a bench report."""
    from .bench.report import OVERALL

    def summarise(groups: dict) -> dict:
        categories = [g for g in groups if g != OVERALL and (groups[g].get("speedup") or {}).get("estimate") is not None]
        return {
            "prompts": groups[OVERALL]["prompts"],
            "speedup": groups[OVERALL].get("speedup"),
            "tau": groups[OVERALL].get("acceptance_length_micro"),
            "speedup_mean_over_categories": (sum(groups[g]["speedup"]["estimate"] for g in categories) / len(categories)
                                             if categories else None),
        }  # fmt: skip

    summary = {}
    for block in report["results"]:
        entry = summarise(block["summary"]["drafter/carry_off"])  # full blocks
        if "drafter/policy_alone" in block["summary"]:  # milestones benchmarked before 2026-12-07 have no adaptive run
            entry["adaptive"] = summarise(block["summary"]["drafter/policy_alone"])
        summary[f"T={block['temperature']:g}"] = entry
    return summary


# -- step 4: carryover on the curve ------------------------------------------------------------------------------------
CARRY_BRANCHES = (("carryover", "carryover"), ("continued", "dflash"))  # branch name, objective
CARRY_COMPARISONS = (("carryover/carry_on", "continued/carry_off"), ("carryover/carry_on", "continued/carry_on"),
                     ("continued/carry_on", "continued/carry_off"))  # fmt: skip


def _stop_callback(stop: StopRequest):
    from transformers import TrainerCallback

    class StopCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if stop.requested:
                control.should_training_stop = True

    return StopCallback()


def compare_carryover(campaign: Campaign, config: CampaignConfig, trainers: "_Trainers", milestone: dict,
                      stop: StopRequest | None = None, progress: bool = True) -> dict | None:  # fmt: skip
    """Carryover against its step-matched continued baseline, from a milestone's weights: two branches of
    `carry_steps` steps on the same batches and anchors (the carryover objective; the dflash objective), benchmarked
    against each other (carryover with carry on against the continued baseline with carry off and on, paired over
    the milestone prompts) and probed for the attention share on carry rows. A branch trained before a stop is kept;
    one cut short is trained again. Returns the record (also saved in the milestone), or None if stopped first."""
    import shutil

    stop = stop or StopRequest()
    folder = Path(milestone["folder"])
    out = folder / CARRY
    branches: dict[str, dict] = {}
    for name, objective in CARRY_BRANCHES:
        branch = out / name
        if not (branch / BRANCH_RECORD).is_file():
            started = time.process_time()
            args = training_arguments(config, branch / "run", objective=objective, max_steps=config.carry_steps,
                                      learning_rate=config.carry_learning_rate, lr_scheduler_type="cosine",
                                      warmup_steps=max(1, config.carry_steps // 10), num_anchors=config.carry_num_anchors,
                                      carryover_plain_weight=config.carry_plain_weight, eval_strategy="no",
                                      save_strategy="no")  # fmt: skip
            trainer = trainers(args, [_stop_callback(stop)], weights=folder)
            print(f"campaign: milestone {milestone['index']}: {name} branch ({objective} objective), "
                  f"{config.carry_steps} steps", flush=True)  # fmt: skip
            trainer.train()
            if stop.requested:
                return None
            evaluation = trainer.evaluate()
            trainer.save_model(str(branch))
            _write_json(branch / BRANCH_RECORD, {
                "objective": objective, "steps": trainer.state.global_step,
                "core_hours": round((time.process_time() - started) / 3600.0, 5),
                "eval_tau": evaluation.get("eval_tau_teacher_forced"), "eval_loss": evaluation.get("eval_loss"),
                "eval_first_draft_tau": evaluation.get("eval_first_draft_tau"),
                "eval_tau_decoding": evaluation.get("eval_tau_decoding"),
            })  # fmt: skip
            shutil.rmtree(branch / "run", ignore_errors=True)
        branches[name] = json.loads((branch / BRANCH_RECORD).read_text())
    if stop.requested:
        return None
    folders = {name: out / name for name, _ in CARRY_BRANCHES}
    report = _benchmark(config, folders, ["carry_off", "carry_on"], [f"{a},{b}" for a, b in CARRY_COMPARISONS],
                        out / "bench", trainers.target, trainers.tokenizer, progress)  # fmt: skip
    record = {"steps": config.carry_steps, "learning_rate": config.carry_learning_rate,
              "num_anchors": config.carry_num_anchors, "plain_weight": config.carry_plain_weight, "branches": branches,
              "bench": _carry_summary(report),
              "attention": _carry_attention(config, folders, trainers.target, trainers.tokenizer)}  # fmt: skip
    _write_json(out / "carry.json", record)
    milestone = {**milestone, CARRY: record}
    campaign.add_milestone(milestone)
    print(f"campaign: milestone {milestone['index']} carryover comparison: {_carry_line(record)}", flush=True)
    return record


def _carry_summary(report: dict) -> dict:
    """Per temperature: each method's tau and speedup, and the paired comparisons (acceptance length gain, speed)."""
    from .bench.report import OVERALL

    summary = {}
    for block in report["results"]:
        overall = {method: groups[OVERALL] for method, groups in block["summary"].items()}
        pairs = {f"{c['a']} vs {c['b']}": {"acceptance_length_relative_gain": c[OVERALL]["acceptance_length_relative_gain"],
                                           "speed_ratio": c[OVERALL].get("speed_ratio")}
                 for c in block["comparisons"] if (c["a"], c["b"]) in CARRY_COMPARISONS}  # fmt: skip
        summary[f"T={block['temperature']:g}"] = {
            "prompts": block["prompts"],
            "methods": {m: {"tau": g.get("acceptance_length_micro"), "speedup": g.get("speedup")} for m, g in overall.items()},
            "comparisons": pairs,
        }  # fmt: skip
    return summary


def _carry_attention(config: CampaignConfig, folders: dict[str, Path], target, tokenizer) -> dict:
    """The attention share of carry rows in each branch's proposals (greedy, carry on, the milestone prompts)."""
    import torch

    from ..modeling_carryover import CarryoverDrafterModel
    from .bench.prompts import encode_prompt
    from .carry_probe import attention_shares

    encoded = [encode_prompt(p, tokenizer) for p in _milestone_prompts(config)]
    shares = {}
    for name, folder in folders.items():
        drafter = CarryoverDrafterModel.from_pretrained(folder, dtype=torch.float32).eval()
        result = attention_shares(target, drafter, encoded, config.milestone_max_new_tokens)
        shares[name] = {k: v for k, v in result.items() if k != "layers"}
    return shares


def _carry_line(record: dict) -> str:
    """A carryover comparison in one line: per temperature, the acceptance-length gain and speed ratio of carryover
    (carry on) over the continued baseline (carry off), and the carry rows' attention share of each branch."""
    parts = []
    for temperature, block in record["bench"].items():
        pair = block["comparisons"].get("carryover/carry_on vs continued/carry_off") or {}
        gain = pair.get("acceptance_length_relative_gain") or {}
        gain_text = (f"{100 * gain['estimate']:+.1f} % [{100 * gain['ci_low']:+.1f}, {100 * gain['ci_high']:+.1f}]"
                     if gain.get("ci_low") is not None else "–")  # fmt: skip
        parts.append(f"{temperature}: τ {gain_text}, speed {_estimate(pair.get('speed_ratio'))}x")
    shares = ", ".join(f"{name} {(a.get('carry_share') or 0):.3f}" for name, a in record["attention"].items())
    return "; ".join(parts) + f"; carry attention share {shares}"


# -- report -----------------------------------------------------------------------------------------------------------
def curve(campaign: Campaign) -> dict:
    """The campaign's learning curve: held-out and training points against training core-hours, and milestones."""
    history = campaign.log_history()

    def points(prefix: str) -> list[dict]:
        return [{"step": e["step"], "core_hours": e.get("core_hours"), "tau": e[f"{prefix}_tau_teacher_forced"],
                 "tau_decoding": e.get(f"{prefix}_tau_decoding"), "tau_t1": e.get(f"{prefix}_tau_t1_teacher_forced"),
                 "loss": e[f"{prefix}_loss"], "acc_pos_01": e.get(f"{prefix}_acc_pos_01")}
                for e in history if f"{prefix}_tau_teacher_forced" in e]  # fmt: skip

    training = [{"step": e["step"], "core_hours": e.get("core_hours"), "loss": e["loss"],
                 "tau": e.get("tau_teacher_forced"), "learning_rate": e.get("learning_rate")}
                for e in history if "loss" in e and "eval_loss" not in e]  # fmt: skip
    changes = []  # each with the core-hours of the first training point after it (steps restart on a new machine)
    for change in campaign.recipe_changes():
        after = [p["core_hours"] for p in training if p["step"] > change["trunk_step"] and p["core_hours"]]
        changes.append({**change, "core_hours": after[0] if after else None})
    inherited = campaign.inherited_curve()  # the machines' before this one, if the campaign moved
    return {"config": asdict(campaign.load_config()), "eval": inherited["eval"] + points("eval"),
            VALIDATION: inherited[VALIDATION] + points(f"eval_{VALIDATION}"), "train": inherited["train"] + training,
            "milestones": campaign.milestones(), "recipe_changes": inherited["recipe_changes"] + changes}  # fmt: skip


# The issue's targets for a drafter on its own (metric key, label, value): the milestones' decoding tau on the
# validation set (the benchmark's kind of prompts) and on the held-out rows, and the drafter-alone speedup with each
# round's length chosen by the cost policy, at each temperature.
CURVE_TARGETS = (
    (f"{VALIDATION}_tau_decoding", "validation τ (decoding)", 2.5),
    (f"{VALIDATION}_tau_decoding", "validation τ (decoding)", 3.5),
    ("eval_tau_decoding", "held-out τ (decoding)", 2.5),
    ("eval_tau_decoding", "held-out τ (decoding)", 3.5),
    ("T=0 adaptive speedup", "drafter alone, T = 0, adaptive length", 1.3),
    ("T=1 adaptive speedup", "drafter alone, T = 1, adaptive length", 1.15),
)
EXTRAPOLATION_WINDOW = 3  # the newest milestones a trend is fitted on (the regime, and the recipe, move along)


def milestone_metric(milestone: dict, key: str) -> float | None:
    """One of the `CURVE_TARGETS` metrics of a milestone (None where it was not measured)."""
    if key.endswith("tau_decoding"):
        return milestone.get(key)
    temperature = key.split()[0]
    adaptive = ((milestone.get("bench") or {}).get(temperature) or {}).get("adaptive") or {}
    return (adaptive.get("speedup") or {}).get("estimate")


def extrapolate(points: list[tuple[float, float]], target: float, window: int = EXTRAPOLATION_WINDOW) -> dict:
    """Training core-hours at which a metric would reach `target` if it kept the trend of its newest `window` points
    (core-hours, value): a least-squares line in log2(core-hours), i.e. a fixed gain per doubling of compute.

    `status` is "reached" (the newest point is at or above the target), "extrapolated" (with `core_hours`),
    "not on this trend" (the fitted gain per doubling is zero or negative) or "too few points" (fewer than 3)."""
    import math

    used = sorted(points)[-window:]
    record: dict[str, Any] = {"target": target, "points": len(used), "latest": used[-1][1] if used else None,
                              "gain_per_doubling": None, "core_hours": None}  # fmt: skip
    if used and used[-1][1] >= target:
        return {**record, "status": "reached"}
    if len(used) < 3:
        return {**record, "status": "too few points"}
    xs, ys = [math.log2(h) for h, _ in used], [v for _, v in used]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    record["gain_per_doubling"] = slope
    if slope <= 0:
        return {**record, "status": "not on this trend"}
    return {**record, "status": "extrapolated", "core_hours": 2 ** (mean_x + (target - mean_y) / slope)}


def extrapolations(milestones: list[dict]) -> list[dict]:
    """`extrapolate` for each of the `CURVE_TARGETS`, on the milestones that measured its metric."""
    out = []
    for key, label, target in CURVE_TARGETS:
        points = [(m["core_hours"], value) for m in milestones if (value := milestone_metric(m, key)) is not None]
        out.append({"metric": key, "label": label, **extrapolate(points, target)})
    return out


def _extrapolation_line(record: dict) -> str:
    gain = record["gain_per_doubling"]
    gain = "–" if gain is None else f"{gain:+.3f}"
    where = {"reached": "reached", "too few points": "too few milestones measured it",
             "not on this trend": "not reached on this trend",
             "extrapolated": f"about {record.get('core_hours') or 0:,.0f} core-hours"}[record["status"]]  # fmt: skip
    return f"| {record['label']} | {record['target']:g} | {_number(record['latest'])} | {gain} | {where} |"


def write_report(campaign: Campaign, out: Path, weights: Path | None = None, trunk: bool = False) -> dict:
    """curve.json, curve.md and curve.png in `out`; with `weights`, the newest milestone's drafter folder there (its
    weights in bfloat16) and the campaign state `start --from` reads; with `trunk`, the trunk's last checkpoint
    instead of the newest milestone (what a campaign that moves machines between milestones goes on from)."""
    import shutil

    from ..training.arguments import DECODING_MAX_TOKENS

    data = curve(campaign)
    data["extrapolation"] = extrapolations(data["milestones"])
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "curve.json", data)
    lines = [f"# Campaign {data['config']['name']}", "", TAU_NOTE.format(tokens=DECODING_MAX_TOKENS), "",
             *_points_table("held-out", data["eval"])]  # fmt: skip
    if data[VALIDATION]:
        lines += ["", "Validation set (`validation_dataset`: the target's greedy responses to eval-split prompts the "
                  "benchmark leaves out), evaluated every `validation_steps`, outside the training core-hours:", "",
                  *_points_table("validation", data[VALIDATION])]  # fmt: skip
    for change in data["recipe_changes"]:
        moved = ", ".join(f"{k} {change['from'][k]} → {change['to'][k]}" for k in change["changed"])
        where = f" ({change['core_hours']:.3f} core-hours)" if change.get("core_hours") else ""
        lines += ["", f"Recipe changed after trunk step {change['trunk_step']}{where} ({change['at']}): {moved}."]
    if data["milestones"]:
        lines += ["", "| milestone | step | core-hours | held-out τ (teacher-forced / decoding / T = 1) | "
                  "validation τ (teacher-forced / decoding / T = 1) | drafter alone (T: speedup, τ) |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for m in data["milestones"]:
            taus = [" / ".join(_number(m.get(prefix + key)) for key in ("tau", "tau_decoding", "tau_t1"))
                    for prefix in ("eval_", f"{VALIDATION}_")]  # fmt: skip
            lines.append(f"| {m['index']} | {m['step']} | {m['core_hours']:.3f} | {taus[0]} | {taus[1]} | "
                         f"{_bench_summary(m) or 'not benchmarked'} |")  # fmt: skip
    compared = [m for m in data["milestones"] if CARRY in m]
    if compared:
        lines += ["", "Carryover (carry on) against the step-matched continued baseline (carry off), from each milestone:",
                  "", "| milestone | steps per branch | held-out τ: carryover's first draft / its draft after a rejection, "
                  "with carry / continued | comparison |", "| --- | --- | --- | --- |"]  # fmt: skip
        for m in compared:
            c = m[CARRY]
            carryover, continued = (c["branches"][name] for name, _ in CARRY_BRANCHES)
            taus = f"{carryover['eval_first_draft_tau']:.3f} / {carryover['eval_tau']:.3f} / {continued['eval_tau']:.3f}"
            lines.append(f"| {m['index']} | {c['steps']} | {taus} | {_carry_line(c)} |")
        lines += ["", "Each comparison's record and bench table: `carry-mNN/` (carry.json, results.md)."]
    if data["milestones"]:
        intro = (f"Targets, extrapolated: a line in log2(core-hours) through the newest {EXTRAPOLATION_WINDOW} "
                 "milestones that measured the metric: a fixed gain per doubling of compute, a trend and not a promise "
                 "(the trunk's own held-out τ between milestones is in the first table; the drafter-alone speedups "
                 "are the milestone benches', on `milestone_prompts_per_category` prompts a category):")  # fmt: skip
        lines += ["", intro, "",
                  "| metric | target | newest milestone | gain per doubling | core-hours to the target |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [_extrapolation_line(r) for r in data["extrapolation"]]
    (out / "curve.md").write_text("\n".join(lines) + "\n")
    _plot(data, out / "curve.png")
    for m in compared:  # each comparison's record and bench table beside the curve (its runs stay in the campaign)
        source, kept = Path(m["folder"]) / CARRY, out / f"carry-m{m['index']:02d}"
        kept.mkdir(exist_ok=True)
        for name in ("carry.json", "bench/results.md"):
            if (source / name).is_file():
                shutil.copy2(source / name, kept / Path(name).name)
    if weights is not None and (data["milestones"] or trunk):
        state = {"name": data["config"]["name"], "milestones": data["milestones"]}
        if trunk:
            source = campaign.last_checkpoint()
            if source is None:
                raise UsageError(f"the campaign in {campaign.dir} has no trunk checkpoint to export yet.")
            source = Path(source)
            # The trunk's own weights and compute: `start --from` goes on where the trunk is, not from a milestone.
            state.update(source="trunk", core_hours=round(_core_seconds_at(str(source)) / 3600.0, 5),
                         trunk_step=campaign.trunk_step())  # fmt: skip
        else:
            newest = data["milestones"][-1]
            source = Path(newest["folder"])
            state.update(source=f"milestone {newest['index']}",
                         core_hours=round(newest["core_hours"] + newest.get("decay_core_hours", 0.0), 5))  # fmt: skip
        weights.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (source / name).is_file():
                shutil.copy2(source / name, weights / name)
        _save_bfloat16(source / "model.safetensors", weights / "model.safetensors")
        state["next_build_start"] = next_build_starts(campaign, campaign.load_config())
        state["curve"] = {key: data[key] for key in CURVE_POINTS}  # the points so far, for the machine after
        _write_json(weights / EXPORT_STATE, state)  # what `start --from` needs to go on with this campaign elsewhere
    return data


def _points_table(label: str, points: list[dict]) -> list[str]:
    """A markdown table of one set's evaluation points (`curve`'s "eval" or "validation")."""
    header = [f"| step | training core-hours | {label} τ (teacher-forced) | {label} τ (decoding) | "
              f"{label} τ at T = 1 (teacher-forced, expected) | {label} loss |", "| --- | --- | --- | --- | --- | --- |"]
    return header + [f"| {p['step']} | {p['core_hours'] or 0:.3f} | {p['tau']:.3f} | {_number(p.get('tau_decoding'))} | "
                     f"{_number(p.get('tau_t1'))} | {p['loss']:.4f} |" for p in points]  # fmt: skip


def _save_bfloat16(source: Path, target: Path) -> None:
    """A copy of a safetensors file with its float32 tensors in bfloat16 (half the bytes to commit; a campaign that
    goes on from it trains in float32 again); other tensors (the draft vocabulary's ids) as they are."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {name: t.to(torch.bfloat16) if t.dtype == torch.float32 else t for name, t in load_file(str(source)).items()}
    save_file(tensors, str(target), metadata={"format": "pt"})


def _bench_summary(milestone: dict) -> str:
    """A milestone's bench in one line: per temperature, the speedup and tau with their intervals."""
    bench = milestone.get("bench") or {}
    return "; ".join(f"{t}: {_estimate(v['speedup'])}x, τ {_estimate(v['tau'])}"
                     + (f" (adaptive length {_estimate(v['adaptive']['speedup'])}x)" if "adaptive" in v else "")
                     for t, v in bench.items())  # fmt: skip


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _estimate(interval: dict | None) -> str:
    if not interval or interval.get("estimate") is None:
        return "–"
    text = f"{interval['estimate']:.2f}"
    return text + (f" [{interval['ci_low']:.2f}, {interval['ci_high']:.2f}]" if interval.get("ci_low") is not None else "")


def _plot(data: dict, path: Path) -> None:
    from .plotting import saved_figure

    with saved_figure(path) as (_, (axis,)):
        points = [p for p in data["eval"] if p["core_hours"] is not None]
        axis.plot([p["core_hours"] for p in points], [p["tau"] for p in points], marker="o",
                  label="held-out τ (teacher-forced)")  # fmt: skip
        decoded = [p for p in points if p.get("tau_decoding") is not None]
        if decoded:
            axis.plot([p["core_hours"] for p in decoded], [p["tau_decoding"] for p in decoded], marker="o",
                      label="held-out τ (decoding)")  # fmt: skip
        sampled = [p for p in points if p.get("tau_t1") is not None]
        if sampled:
            axis.plot([p["core_hours"] for p in sampled], [p["tau_t1"] for p in sampled], marker=".",
                      label="held-out τ at T = 1 (teacher-forced, expected)")  # fmt: skip
        validated = [p for p in data.get(VALIDATION, []) if p["core_hours"] is not None and p.get("tau_decoding")]
        if validated:
            axis.plot([p["core_hours"] for p in validated], [p["tau_decoding"] for p in validated], marker="*",
                      label="validation τ (decoding)")  # fmt: skip
        for key, marker, label in ((f"{VALIDATION}_tau_decoding", "P", "milestone validation τ (decoding)"),
                                   ("eval_tau_decoding", "^", "milestone held-out τ (decoding)"),
                                   ("eval_tau_t1", "v", "milestone held-out τ at T = 1 (expected)")):  # fmt: skip
            measured = [m for m in data["milestones"] if m.get(key) is not None]
            if measured:
                axis.plot([m["core_hours"] for m in measured], [m[key] for m in measured], marker=marker, linestyle=":",
                          label=label)  # fmt: skip
        for change in data.get("recipe_changes", []):  # where the trunk's loss changed, once the curve passes it
            if change.get("core_hours"):
                axis.axvline(change["core_hours"], color="grey", linestyle="--", linewidth=1)
        for temperature in ("T=0", "T=1"):
            marks = [(m["core_hours"], m["bench"][temperature]) for m in data["milestones"]
                     if temperature in (m.get("bench") or {})]  # fmt: skip
            if marks:
                axis.plot([h for h, _ in marks], [(v["speedup"] or {}).get("estimate") for _, v in marks], marker="s",
                          linestyle="--", label=f"drafter alone speedup, {temperature}")  # fmt: skip
            adaptive = [(h, v["adaptive"]) for h, v in marks if "adaptive" in v]
            if adaptive:
                axis.plot([h for h, _ in adaptive], [(v["speedup"] or {}).get("estimate") for _, v in adaptive],
                          marker="D", linestyle="-.", label=f"drafter alone, adaptive length, {temperature}")  # fmt: skip
        axis.set_xscale("log")
        axis.set_xlabel("training core-hours")
        axis.set_title(f"campaign {data['config']['name']}")
        axis.grid(True, alpha=0.3)
        axis.legend()


# -- command line -----------------------------------------------------------------------------------------------------
def _start(campaign: Campaign, config: CampaignConfig | None, foreground: bool, seed_from: str | None = None,
           build_threads: int | None = None) -> int:  # fmt: skip
    pid = campaign.running_pid()
    if pid is not None:
        raise UsageError(f"the campaign in {campaign.dir} is already running (pid {pid}); `carryover-hf campaign "
                         "status` shows it, `stop` ends it.")  # fmt: skip
    if seed_from is not None:
        if (campaign.dir / TRUNK).exists():
            raise UsageError(f"{campaign.dir} already has a trunk; --from only starts a campaign that has not trained yet.")
        read_export(Path(seed_from), config or (campaign.load_config() if campaign.exists() else CampaignConfig()))
    config = campaign.create_or_check(config)
    if seed_from is not None and campaign.seed() is None:
        campaign.seed_from(Path(seed_from), config)
    if foreground:
        (campaign.dir / PID_FILE).write_text(str(os.getpid()))
        run(campaign.dir, build_threads=build_threads)
        return 0
    pool = str(max(config.threads, build_threads or 0))  # `run` sets the torch threads of each phase itself
    env = {**os.environ, "OMP_NUM_THREADS": pool, "MKL_NUM_THREADS": pool, "TOKENIZERS_PARALLELISM": "false"}
    log = open(campaign.dir / LOG_FILE, "a")
    command = [sys.executable, "-m", "carryover_hf", "campaign", "run", "--dir", str(campaign.dir)]
    if build_threads:
        command += ["--build_threads", str(build_threads)]
    process = subprocess.Popen(command,
                               stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
    (campaign.dir / PID_FILE).write_text(str(process.pid))
    building = f", {build_threads} while it builds feature stores" if build_threads else ""
    print(f"campaign {config.name}: running in the background (pid {process.pid}, {config.threads} thread(s){building}); "
          f"log {campaign.dir / LOG_FILE}")  # fmt: skip
    return 0


def _status(campaign: Campaign) -> int:
    config = campaign.load_config()
    pid = campaign.running_pid()
    history = campaign.log_history()
    evaluation = [e for e in history if "eval_tau_teacher_forced" in e]
    steps = max((e["step"] for e in history), default=0)
    hours = max((e.get("core_hours") or 0 for e in history), default=0.0)
    print(f"campaign {config.name} in {campaign.dir}: {'running, pid ' + str(pid) if pid else 'not running'}")
    print(f"  step {steps}, {hours:.3f} training core-hours logged; "
          f"next milestone at {milestone_core_hours(config, len(campaign.milestones())):g}")  # fmt: skip
    for e in evaluation[-5:]:
        print(f"  step {e['step']:>7}  core-hours {e.get('core_hours') or 0:7.3f}  held-out tau "
              f"{e['eval_tau_teacher_forced']:.3f} (decoding {_number(e.get('eval_tau_decoding'))})")  # fmt: skip
    for e in [e for e in history if f"eval_{VALIDATION}_tau_decoding" in e][-3:]:
        print(f"  step {e['step']:>7}  core-hours {e.get('core_hours') or 0:7.3f}  validation tau (decoding) "
              f"{e[f'eval_{VALIDATION}_tau_decoding']:.3f}")  # fmt: skip
    for m in campaign.milestones():
        print(f"  milestone {m['index']}: step {m['step']}, {m['core_hours']:.3f} core-hours, held-out tau "
              f"{m.get('eval_tau')} (decoding {_number(m.get('eval_tau_decoding'))}, validation "
              f"{_number(m.get(f'{VALIDATION}_tau_decoding'))}); drafter alone "
              f"{_bench_summary(m) or 'not benchmarked'}")  # fmt: skip
        if CARRY in m:
            print(f"    carryover against the continued baseline ({m[CARRY]['steps']} steps each): {_carry_line(m[CARRY])}")
    return 0


def _stop(campaign: Campaign, wait: float) -> int:
    pid = campaign.running_pid()
    if pid is None:
        print(f"the campaign in {campaign.dir} is not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and campaign.running_pid() is not None:
        time.sleep(1)
    print("stopped" if campaign.running_pid() is None else
          f"asked pid {pid} to stop; it checkpoints and exits after its current step")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carryover-hf campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "run", "status", "stop", "report"])
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"the campaign folder, outside the work tree (default {DEFAULT_DIR})")
    parser.add_argument("--config", help="start: a JSON file of CampaignConfig settings (default: the built-in ones)")
    parser.add_argument("--foreground", action="store_true", help="start: run in this process instead of the background")
    parser.add_argument("--from", dest="seed_from",
                        help="start: a new campaign's trunk starts from this exported milestone (`report --weights`), "
                        "e.g. on a machine without the campaign folder; its core-hours and milestones carry over")
    parser.add_argument("--build_threads", type=int,
                        help="start, run: torch threads while the feature stores are built or extended (e.g. 2 on a "
                        "machine the campaign moved to, while nothing else runs); training keeps the campaign's threads")
    parser.add_argument("--out", help="report: folder for curve.json, curve.md, curve.png")
    parser.add_argument("--weights", help="report: also copy the newest milestone's drafter (config + safetensors) here")
    parser.add_argument("--trunk", action="store_true",
                        help="report --weights: copy the trunk's last checkpoint instead (to go on from it elsewhere)")
    parser.add_argument("--wait", type=float, default=120.0, help="stop: seconds to wait for the checkpoint")
    args = parser.parse_args(argv)
    if args.build_threads is not None and args.build_threads < 1:
        raise UsageError(f"--build_threads must be at least 1, got {args.build_threads}.")
    campaign = Campaign(args.dir)
    if args.action == "start":
        config = None
        if args.config:
            if not Path(args.config).is_file():
                raise UsageError(f"--config {args.config!r} is not a file.")
            config = CampaignConfig.from_dict(json.loads(Path(args.config).read_text()))
        return _start(campaign, config, args.foreground, args.seed_from, args.build_threads)
    if args.action == "run":
        run(campaign.dir, build_threads=args.build_threads)
        return 0
    if args.action == "status":
        return _status(campaign)
    if args.action == "stop":
        return _stop(campaign, args.wait)
    if not args.out:
        raise UsageError("campaign report needs --out FOLDER.")
    if args.trunk and not args.weights:
        raise UsageError("--trunk needs --weights FOLDER: it says which weights to copy there.")
    write_report(campaign, Path(args.out), Path(args.weights) if args.weights else None, trunk=args.trunk)
    which = "the trunk's last checkpoint" if args.trunk else "the newest milestone"
    print(f"wrote {args.out}/curve.json, curve.md, curve.png" + (f" and {which} to {args.weights}" if args.weights else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
