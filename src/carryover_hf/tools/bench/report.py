"""The benchmark report: every number with its settings and versions as JSON, a markdown summary and PNG plots.

Files written by `write_report(report, folder)`: `results.json`, `results.md`, `acceptance_by_position.png`,
`speedup_by_category.png`.

Definitions (also written into the report under `definitions`):
* acceptance length (tau): tokens a verification round adds, bonus included. Micro: all rounds of all prompts
  pooled (vLLM's `1 + accepted / drafts`). Per prompt: the mean over prompts of each prompt's mean (as DFlash reports).
* decode throughput: tokens after the first target forward, divided by the time from that forward's output to the
  end of `generate`; speedup is a method's throughput over the target alone's, pooled over the same prompts.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...resources import checkout_root
from ..plotting import saved_figure
from . import stats

SCHEMA = "carryover-hf-bench/1"
OVERALL = "all"
DEFINITIONS = {
    "acceptance_length_micro": "sum of tokens added per verification round over all rounds / number of rounds "
    "(bonus included; rounds after the prefill forward)",
    "acceptance_length_per_prompt": "mean over prompts of each prompt's mean acceptance length",
    "position_acceptance": "per draft position j: rounds that accepted the draft at j / rounds that proposed one at j",
    "decode_tokens_per_second": "tokens after the first target forward / time from its output to the end of generate, "
    "pooled over prompts",
    "speedup": "decode_tokens_per_second of the method / that of the target alone, on the same prompts",
    "drafting_ms_per_round": "time inside the candidate generator per round (drafter forward, picking tokens)",
    "verification_ms_per_round": "time from the candidates to the acceptance decision per round (target forward, "
    "acceptance, cache crop)",
    "rest_ms_per_round": "the rest of the decoding loop per round: acceptance decision -> next proposal (streamer, "
    "stopping criteria, bookkeeping; the last round ends at the end of generate)",
    "target_step_ms": "the target's 1-token step in the same run: decode time / decode tokens of the target alone on "
    "the same prompts",
    "round_profile": "proposal, verification and rest of the loop per round, each also over the target's 1-token step "
    "(ratios of pooled times, paired over the same prompts)",
    "intervals": "bootstrap over prompts (scipy.stats.bootstrap, BCa; percentile where BCa is undefined); comparisons "
    "resample the same prompts for both methods (paired)",
}


# -- summaries -------------------------------------------------------------------------------------------------------
def _arrays(runs: Sequence) -> dict[str, np.ndarray]:
    return {
        "acc_sum": np.array([sum(r.acceptance_lengths) for r in runs], dtype=float),
        "rounds": np.array([len(r.acceptance_lengths) for r in runs], dtype=float),
        "decode_tokens": np.array([r.decode_tokens for r in runs], dtype=float),
        "decode_time": np.array([r.decode_time for r in runs], dtype=float),
        "new_tokens": np.array([r.new_tokens for r in runs], dtype=float),
        "total_time": np.array([r.total_time for r in runs], dtype=float),
        "drafting_ms": np.array([r.drafting_time for r in runs], dtype=float) * 1000,
        "verification_ms": np.array([r.verification_time for r in runs], dtype=float) * 1000,
        "rest_ms": np.array([getattr(r, "rest_time", 0.0) for r in runs], dtype=float) * 1000,
        "decode_ms": np.array([r.decode_time for r in runs], dtype=float) * 1000,
        "prefill_ms": np.array([r.prefill_time for r in runs], dtype=float) * 1000,
        "planning_ms": np.array([getattr(r, "planning_time", None) or 0.0 for r in runs], dtype=float) * 1000,
    }


def summarize(runs: Sequence, baseline: Sequence, speculative: bool, withheld: str | None, **bootstrap) -> dict:
    """Metrics of one method over `runs` (one per prompt), with `baseline` the target alone on the same prompts."""
    a, b = _arrays(runs), _arrays(baseline)
    out: dict[str, Any] = {
        "prompts": len(runs),
        "new_tokens": int(a["new_tokens"].sum()),
        "rounds": int(a["rounds"].sum()),
    }
    if speculative:
        has_rounds = a["rounds"] > 0
        out["acceptance_length_micro"] = stats.bootstrap_interval([a["acc_sum"], a["rounds"]], stats.ratio_of_sums, **bootstrap).to_dict()
        out["acceptance_length_per_prompt"] = stats.bootstrap_interval(
            [a["acc_sum"][has_rounds] / a["rounds"][has_rounds]], stats.mean, **bootstrap
        ).to_dict()
        rates = stats.position_acceptance_rates([r.acceptance_lengths for r in runs], [r.draft_lengths for r in runs])
        out["position_acceptance"] = rates.to_dict()
        drafts = sum(sum(r.draft_lengths) for r in runs)
        out["drafts_per_round"] = drafts / out["rounds"] if out["rounds"] else None
        out["drafting_ms_per_round"] = stats.bootstrap_interval([a["drafting_ms"], a["rounds"]], stats.ratio_of_sums, **bootstrap).to_dict()
        out["verification_ms_per_round"] = stats.bootstrap_interval(
            [a["verification_ms"], a["rounds"]], stats.ratio_of_sums, **bootstrap
        ).to_dict()
        out["rest_ms_per_round"] = stats.bootstrap_interval([a["rest_ms"], a["rounds"]], stats.ratio_of_sums, **bootstrap).to_dict()
        out["round_profile"] = round_profile(a, b, **bootstrap)
        if all(getattr(r, "planning_time", None) is not None for r in runs):  # journals before 0.3 did not record it
            out["round_profile"]["planning_per_target_step"] = stats.bootstrap_interval(
                [a["planning_ms"], a["rounds"], b["decode_ms"], b["decode_tokens"]], stats.ratio_of_rates, **bootstrap
            ).to_dict()
        carry = [c for r in runs if r.carry_rows is not None for c in r.carry_rows]
        if any(r.carry_rows is not None for r in runs):
            out["mean_carry_rows"] = float(np.mean(carry)) if carry else 0.0
    if withheld:
        out["speed_withheld"] = withheld
        return out
    out["prefill_ms"] = stats.bootstrap_interval([a["prefill_ms"]], stats.mean, **bootstrap).to_dict()
    out["decode_tokens_per_second"] = stats.bootstrap_interval(
        [a["decode_tokens"], a["decode_time"]], stats.ratio_of_sums, **bootstrap
    ).to_dict()
    out["end_to_end_tokens_per_second"] = stats.bootstrap_interval(
        [a["new_tokens"], a["total_time"]], stats.ratio_of_sums, **bootstrap
    ).to_dict()
    out["speedup"] = stats.bootstrap_interval(
        [a["decode_tokens"], a["decode_time"], b["decode_tokens"], b["decode_time"]], stats.ratio_of_rates, **bootstrap
    ).to_dict()
    return out


def round_profile(a: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray], **bootstrap) -> dict:
    """Per-round proposal / verification / rest times, each over the target's 1-token step on the same prompts."""
    step = [target["decode_ms"], target["decode_tokens"]]
    out = {"target_step_ms": stats.bootstrap_interval(step, stats.ratio_of_sums, **bootstrap).to_dict()}
    for part, key in (("proposal", "drafting_ms"), ("verification", "verification_ms"), ("rest", "rest_ms")):
        out[f"{part}_per_target_step"] = stats.bootstrap_interval(
            [a[key], a["rounds"], *step], stats.ratio_of_rates, **bootstrap
        ).to_dict()
    return out


def compare(runs_a: Sequence, runs_b: Sequence, speed: bool, **bootstrap) -> dict:
    """Paired comparison of method a against b on the same prompts (a minus b, a over b)."""
    a, b = _arrays(runs_a), _arrays(runs_b)
    both = (a["rounds"] > 0) & (b["rounds"] > 0)
    rates = [a["acc_sum"], a["rounds"], b["acc_sum"], b["rounds"]]
    out = {
        "prompts": len(runs_a),
        "acceptance_length_micro_difference": stats.bootstrap_interval(rates, stats.difference_of_rates, **bootstrap).to_dict(),
        "acceptance_length_relative_gain": stats.bootstrap_interval(
            rates, stats.relative_difference_of_rates, **bootstrap
        ).to_dict(),
        "acceptance_length_per_prompt_difference": stats.bootstrap_interval(
            [a["acc_sum"][both] / a["rounds"][both], b["acc_sum"][both] / b["rounds"][both]],
            stats.mean_difference,
            **bootstrap,
        ).to_dict(),
    }
    if speed:
        out["speed_ratio"] = stats.bootstrap_interval(
            [a["decode_tokens"], a["decode_time"], b["decode_tokens"], b["decode_time"]], stats.ratio_of_rates, **bootstrap
        ).to_dict()
    else:
        out["speed_withheld"] = "a method failed the greedy correctness gate"
    return out


def _correctness(runs: Sequence, tolerance: float) -> dict:
    greedy = [r for r in runs if r.check is not None]
    by_method: dict[str, dict] = {}
    for method in dict.fromkeys(r.method for r in greedy):
        checks = [r.check for r in greedy if r.method == method]
        gaps = [c["max_gap_after_divergence"] for c in checks if "max_gap_after_divergence" in c]
        by_method[method] = {
            "prompts": len(checks),
            "identical": sum(c["identical"] for c in checks),
            "mean_agreement": float(np.mean([c["agreement"] for c in checks])),
            "diverged_at_near_tie": sum(not c["identical"] and c["passed"] for c in checks),
            "failed": sum(not c["passed"] for c in checks),
            "max_gap_after_divergence": max(gaps) if gaps else None,
        }
    failures = [
        {"method": r.method, "prompt_id": r.prompt_id, **{k: v for k, v in r.check.items() if k != "identical"}}
        for r in greedy
        if not r.check["passed"]
    ]
    return {
        "checked": bool(greedy),
        "tolerance": tolerance,
        "rule": "greedy speculative outputs must equal the target alone; where they part, the target's logits of both "
        "tokens on the shared prefix, and of every later token of the speculative output on its own prefix, must lie "
        "within `tolerance` of the target's top logit (tolerance 0: identical tokens required)",
        "passed": not failures,
        "by_method": by_method,
        "failures": failures,
    }


# -- environment ---------------------------------------------------------------------------------------------------
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> dict[str, Any] | None:
    """The source checkout's commit, when the package runs from one (None for an installed wheel)."""
    root = checkout_root()
    if root is None:
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def machine(device: torch.device) -> str:
    """The processor (or GPU) that timed a run, by name: `model name` of /proc/cpuinfo on Linux."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    packages = ["carryover-hf", "torch", "transformers", "accelerate", "safetensors", "numpy", "scipy", "matplotlib", "tqdm"]
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "machine": machine(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "packages": {p: _version(p) for p in packages},
        "git": _git_commit(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the report ----------------------------------------------------------------------------------------------------
def _select(index: Mapping, prompts: Sequence, method: str, group: str) -> list:
    """The runs of `method` on the prompts of `group`, in prompt order (the same order for every method: paired).

    `prompts` are those measured at the temperature of `index`: every method ran on each (a prompt group is
    journaled whole), so the selections of two methods stay paired in a partial run too."""
    return [index[(method, p.id)] for p in prompts if group in (OVERALL, p.category)]


def build_report(
    runs: Sequence,
    methods: Sequence,
    skipped: Sequence[dict],
    comparisons: Sequence[tuple[str, str]],
    prompts: Sequence,
    settings,
    tie_tolerance: float,
    target,
    drafters: Mapping[str, Any],
    overhead: Mapping[str, Any],
    run_info: Mapping[str, Any],
    progress: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report dict (see the module docstring). `progress` says how much of the run was measured (a run stopped
    by its time limit covers only some prompts at some temperatures; every summary is over the prompts measured)."""
    bootstrap = {"n_resamples": settings.bootstrap_resamples, "confidence": settings.confidence, "seed": settings.seed}
    correctness = _correctness(runs, tie_tolerance)
    failed = {f["method"] for f in correctness["failures"]}
    categories = sorted({p.category for p in prompts})
    groups = [OVERALL] + (categories if len(categories) > 1 else [])
    speculative = {m.name: m.speculative for m in methods}

    results = []
    for temperature in settings.temperatures:
        index = {(r.method, r.prompt_id): r for r in runs if r.temperature == float(temperature)}
        measured = [p for p in prompts if ("target", p.id) in index]
        select = functools.partial(_select, index, measured)

        summary = {
            m.name: {
                g: summarize(
                    select(m.name, g),
                    select("target", g),
                    speculative[m.name],
                    "failed the greedy correctness gate" if m.name in failed else None,
                    **bootstrap,
                )
                for g in groups
            }
            for m in methods
        }
        pairs = [
            {"a": a, "b": b, **{g: compare(select(a, g), select(b, g), a not in failed and b not in failed, **bootstrap) for g in groups}}
            for a, b in comparisons
        ]
        results.append(
            {"temperature": float(temperature), "prompts": len(measured), "summary": summary, "comparisons": pairs}
        )

    text = target.config.get_text_config()
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run": dict(run_info),
        "progress": dict(progress or {"complete": True}),
        "settings": {**asdict(settings), "tie_tolerance_used": tie_tolerance, "dtype": str(target.dtype).removeprefix("torch.")},
        "environment": environment(target.device),
        "target": {
            "name_or_path": target.config._name_or_path or None,
            "model_type": target.config.model_type,
            "num_hidden_layers": text.num_hidden_layers,
            "hidden_size": text.hidden_size,
            "vocab_size": text.vocab_size,
            "parameters": _parameters(target),
        },
        "drafters": {
            name: {
                "name_or_path": d.config._name_or_path or None,
                "drafter_type": d.config.drafter_type,
                "block_size": d.config.block_size,
                "num_hidden_layers": d.config.num_hidden_layers,
                "target_layer_ids": list(d.config.target_layer_ids),
                "trained_with_carryover": d.config.trained_with_carryover,
                "parameters": _parameters(d),
            }
            for name, d in drafters.items()
        },
        "prompts": {
            "count": len(prompts),
            "by_category": dict(Counter(p.category for p in prompts)),
            "multi_turn_first_turn_only": sum(p.meta.get("num_turns", 1) > 1 for p in prompts),
            "ids": [p.id for p in prompts],
        },
        "methods": [m.describe() for m in methods],
        "skipped_methods": list(skipped),
        "groups": groups,
        "definitions": DEFINITIONS,
        "correctness": correctness,
        "results": results,
        "overhead": dict(overhead),
        "runs": [r.to_dict() for r in runs],
    }


# -- rendering -----------------------------------------------------------------------------------------------------
def _fmt(interval: Mapping | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if not interval or interval.get("estimate") is None:
        return "–"
    text = f"{interval['estimate'] * scale:.{digits}f}{suffix}"
    if interval.get("ci_low") is not None:
        text += f" [{interval['ci_low'] * scale:.{digits}f}, {interval['ci_high'] * scale:.{digits}f}]"
    return text


def _cpu_kernels_note(run: Mapping[str, Any]) -> str:
    """The header's note on `--cpu_kernels` (reports from before its rename record `packed_linears`)."""
    kernels = run.get("cpu_kernels", run.get("packed_linears"))
    if not kernels:
        return ""
    if not isinstance(kernels, Mapping):
        return " · packed linears"
    parts = ["packed linears"] if kernels.get("packed_linears") else []
    parts += ["grouped-query attention"] if kernels.get("grouped_attention") else []
    return f" · CPU kernels ({', '.join(parts)})" if parts else ""


def _new_context_sentence(overhead: Mapping[str, Any]) -> str:
    """How many new context rows each timed proposal fused (reports from before the setting: none)."""
    rows = {result.get("new_context_rows", 0) for result in overhead.values()}
    if rows == {0}:
        return ("The proposals fuse no new context rows (the measurement's design before 2026-12-03; every round of "
                "generate fuses at least one, so the carry here also pays the fusion layer's whole weight pass).")
    counts = ", ".join(str(r) for r in sorted(rows))
    return (f"Each proposal also fuses {counts} new context row(s), as every round of generate does (its accepted "
            "rows), so the carry adds rows to a fusion that runs anyway.")


def _policy_memory_note(memory: Mapping[str, Any]) -> str:
    """What the cost-aware policy's timed calls started from (`--policy_memory`), for the markdown report."""
    if memory["mode"] == "warmup":
        warmup = memory["warmup"]
        return (f"Round policy memory (`--policy_memory warmup`): every timed `policy` call started from what the "
                f"policy learnt on the warm-up ({warmup['generations']} greedy generation(s) of up to "
                f"{warmup['max_new_tokens']} tokens on prompt `{warmup['prompt']}`), so its rounds do not depend on "
                "the order of the prompts or on a resume.")
    if memory["mode"] == "reset":
        return ("Round policy memory (`--policy_memory reset`): every timed `policy` call started as on a fresh "
                "drafter, so its rounds do not depend on the order of the prompts or on a resume.")
    return ("Round policy memory (`--policy_memory carry`): each timed `policy` call went on from what the calls "
            "before it in the same process taught the policy, so its rounds depend on the order of the prompts and "
            "on where a resumed run started.")


def to_markdown(report: Mapping[str, Any]) -> str:
    s = report["settings"]
    target = report["target"]["name_or_path"] or report["target"]["model_type"]
    confidence = round(s["confidence"] * 100)
    lines = [
        f"# Benchmark: {target}",
        "",
        f"{report['created']} · {report['prompts']['count']} prompts ({', '.join(f'{k} {v}' for k, v in report['prompts']['by_category'].items())}) · "
        f"max_new_tokens {s['max_new_tokens']} · {s['dtype']} on {report['environment']['device']}"
        + (f" ({report['environment']['gpu']})" if report["environment"].get("gpu") else "")
        + _cpu_kernels_note(report["run"])
        + f" · seed {s['seed']} · {confidence}% bootstrap intervals over prompts ({s['bootstrap_resamples']} resamples)",
        "",
        (
            "tau: acceptance length per verification round, bonus included (micro: pooled over rounds; per prompt: "
            "mean of prompt means). Speedup: decode throughput over the target alone on the same prompts."
        ),
    ]
    progress = report.get("progress") or {"complete": True}
    if not progress["complete"]:
        lines += [
            "",
            f"**Partial run**: {progress['prompt_groups']} of {progress['prompt_groups_total']} prompt groups (a "
            "prompt at a temperature, every method) measured so far; every figure is over the prompts measured. "
            "Rerun the same command with `--resume` to measure the rest.",
        ]
    if len(progress.get("segments") or []) > 1:
        lines += [
            "",
            f"Measured in {len(progress['segments'])} invocations (`--resume`), starting "
            + ", ".join(seg["started"] for seg in progress["segments"])
            + "; the methods of a prompt always ran back to back in one.",
        ]
        machines = {seg["segment"]: seg.get("machine") or "not recorded" for seg in progress["segments"]}
        if len(set(machines.values())) > 1:
            lines += [
                "",
                "**Timed on more than one machine**: "
                + "; ".join(f"invocation {number}: {name}" for number, name in machines.items())
                + ". Speedups and their comparisons are paired within a prompt's group, which one machine timed; "
                "tok/s and ms figures pool the machines.",
            ]
    multi_turn = report["prompts"].get("multi_turn_first_turn_only")
    if multi_turn:
        lines += ["", f"{multi_turn} multi-turn prompts were benchmarked on their first turn only."]
    memory = report.get("policy_memory")
    if memory and any(m.get("kind") in ("policy", "policy_alone") for m in report["methods"]):
        lines += ["", _policy_memory_note(memory)]
    correctness = report["correctness"]
    for block in report["results"]:
        t = block["temperature"]
        lines += ["", f"## Temperature {t:g}", ""]
        if block.get("prompts", report["prompts"]["count"]) != report["prompts"]["count"]:
            lines += [f"{block['prompts']} of {report['prompts']['count']} prompts measured.", ""]
        lines += [
            "| method | tau micro | tau per prompt | decode tok/s | speedup | draft ms/round | verify ms/round | greedy agreement |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for method, groups in block["summary"].items():
            m = groups[OVERALL]
            check = correctness["by_method"].get(method) if t == 0 else None
            agreement = (
                f"{check['identical']}/{check['prompts']} identical, {check['diverged_at_near_tie']} near-tie, "
                f"{check['mean_agreement']:.1%} tokens"
                + (f", {check['failed']} FAILED" if check["failed"] else "")
                if check
                else "–"
            )
            withheld = "withheld" if "speed_withheld" in m else None
            lines.append(
                f"| {method} | {_fmt(m.get('acceptance_length_micro'))} | {_fmt(m.get('acceptance_length_per_prompt'))} | "
                f"{withheld or _fmt(m.get('decode_tokens_per_second'), digits=1)} | {withheld or _fmt(m.get('speedup'), suffix='x')} | "
                f"{_fmt(m.get('drafting_ms_per_round'))} | {_fmt(m.get('verification_ms_per_round'))} | {agreement} |"
            )
        profiled = [(method, g[OVERALL]) for method, g in block["summary"].items() if "round_profile" in g[OVERALL]]
        if profiled:
            lines += [
                "",
                "### Round profile (per round; in parentheses: over the target's 1-token step in this run)",
                "",
                "| method | drafts/round | proposal ms | verification ms | rest of loop ms | target 1-token step ms |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for method, m in profiled:
                profile = m["round_profile"]
                cells = [
                    f"{_fmt(m.get(key))} ({_fmt(profile[part + '_per_target_step'], digits=3, suffix='x')})"
                    for key, part in (("drafting_ms_per_round", "proposal"), ("verification_ms_per_round", "verification"),
                                      ("rest_ms_per_round", "rest"))
                ]
                drafts = m.get("drafts_per_round")
                lines.append(f"| {method} | {'–' if drafts is None else f'{drafts:.2f}'} | " + " | ".join(cells)
                             + f" | {_fmt(profile['target_step_ms'])} |")
        groups = report["groups"]
        if len(groups) > 1:
            for title, key, suffix in (("Speedup by category", "speedup", "x"), ("tau (micro) by category", "acceptance_length_micro", "")):
                lines += ["", f"### {title}", "", "| method | " + " | ".join(groups) + " |", "|---" * (len(groups) + 1) + "|"]
                for method, by_group in block["summary"].items():
                    if method == "target":
                        continue
                    lines.append(f"| {method} | " + " | ".join(_fmt(by_group[g].get(key), suffix=suffix) for g in groups) + " |")
        if block["comparisons"]:
            lines += [
                "",
                "### Paired comparisons (A vs B, same prompts)",
                "",
                "| A | B | delta tau micro | tau gain | delta tau per prompt | speed ratio A/B |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for c in block["comparisons"]:
                m = c[OVERALL]
                lines.append(
                    f"| {c['a']} | {c['b']} | {_fmt(m['acceptance_length_micro_difference'], digits=3)} | "
                    f"{_fmt(m['acceptance_length_relative_gain'], scale=100, digits=1, suffix='%')} | "
                    f"{_fmt(m['acceptance_length_per_prompt_difference'], digits=3)} | "
                    f"{'withheld' if 'speed_withheld' in m else _fmt(m['speed_ratio'], digits=3, suffix='x')} |"
                )
    if report["overhead"]:
        lines += [
            "",
            "## Carry overhead in isolation",
            "",
            "One proposal (drafter forward + LM head + argmax) on the same recorded context, with 0 and with B-1 carry rows, "
            "each right after a target 1-token step (one forward, LM head included) on the same context, as every proposal "
            "of generate follows the target's verification forward (both start from the caches that forward leaves). "
            + _new_context_sentence(report["overhead"]),
            "",
            "| drafter | context | ms, no carry | ms, B-1 carry rows | overhead ms | overhead | target step ms | "
            "proposal / target step |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, result in report["overhead"].items():
            for row in result["by_context_length"]:
                lines.append(
                    f"| {name} | {row['context_length']} | {_fmt(row['ms_without_carry'], digits=3)} | "
                    f"{_fmt(row['ms_with_carry'], digits=3)} | {_fmt(row['overhead_ms'], digits=3)} | "
                    f"{_fmt(row['overhead_relative'], scale=100, digits=1, suffix='%')} | "
                    f"{_fmt(row.get('target_step_ms'), digits=2)} | "
                    f"{_fmt(row.get('proposal_without_carry_per_target_step'), scale=100, digits=1, suffix='%')} |"
                )
    lines += ["", "## Correctness", ""]
    if correctness["checked"]:
        lines.append(
            f"Greedy gate: {'PASSED' if correctness['passed'] else 'FAILED'} (tolerance {correctness['tolerance']} logits; "
            f"{correctness['rule']})."
        )
        for f in correctness["failures"][:20]:
            lines.append(f"* {f['method']} on {f['prompt_id']}: {f.get('reason')}")
    else:
        lines.append("No greedy run (temperature 0), so no output was checked; sampled runs report acceptance and speed only.")
    if report["skipped_methods"]:
        lines += ["", "## Skipped methods", ""] + [f"* {s['name']}: {s['reason']}" for s in report["skipped_methods"]]
    env = report["environment"]
    lines += [
        "",
        "## Environment",
        "",
        f"python {env['python']} · " + " · ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
        + (f" · git {env['git']['commit'][:10]}{' (dirty)' if env['git']['dirty'] else ''}" if env.get("git") else ""),
        "",
    ]
    return "\n".join(lines)


def plot_acceptance_by_position(report: Mapping[str, Any], path: str | Path) -> None:
    blocks = report["results"]
    with saved_figure(path, figsize=(5.5 * len(blocks), 4), ncols=len(blocks)) as (fig, axes):
        _draw_acceptance_by_position(fig, axes, blocks)


def _draw_acceptance_by_position(fig, axes, blocks) -> None:
    for ax, block in zip(axes, blocks):
        for method, groups in block["summary"].items():
            rates = groups[OVERALL].get("position_acceptance", {}).get("rates")
            if rates:
                xs = [j + 1 for j, r in enumerate(rates) if r is not None]
                ax.plot(xs, [r for r in rates if r is not None], marker="o", markersize=3, label=method)
        ax.set_title(f"T = {block['temperature']:g}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate (given proposed)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # nothing to label in a partial run without drafted rounds yet
            ax.legend(fontsize=7)
    fig.suptitle("Acceptance by draft position")


def plot_speedup_by_category(report: Mapping[str, Any], path: str | Path) -> None:
    blocks, groups = report["results"], report["groups"]
    with saved_figure(path, figsize=(max(6, 1.6 * len(groups)) * len(blocks), 4), ncols=len(blocks)) as (fig, axes):
        _draw_speedup_by_category(fig, axes, report, blocks, groups)


def _draw_speedup_by_category(fig, axes, report, blocks, groups) -> None:
    for ax, block in zip(axes, blocks):
        methods = [m for m in block["summary"] if m != "target"]
        width = 0.8 / max(len(methods), 1)
        for i, method in enumerate(methods):
            values, lows, highs = [], [], []
            for g in groups:
                s = block["summary"][method][g].get("speedup") or {}
                est = s.get("estimate")
                values.append(np.nan if est is None else est)
                # An interval that leaves out its estimate (a percentile interval may) is drawn from the estimate.
                lows.append(0 if s.get("ci_low") is None or est is None else max(est - s["ci_low"], 0))
                highs.append(0 if s.get("ci_high") is None or est is None else max(s["ci_high"] - est, 0))
            xs = np.arange(len(groups)) + (i - (len(methods) - 1) / 2) * width
            ax.bar(xs, values, width, yerr=[lows, highs], capsize=2, label=method)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(groups)), groups, rotation=20)
        ax.set_ylabel("speedup over target alone")
        ax.set_title(f"T = {block['temperature']:g}")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Decode speedup by category ({round(report['settings']['confidence'] * 100)}% CI)")


def write_report(report: Mapping[str, Any], output_dir: str | Path) -> dict[str, Path]:
    """Writes results.json, results.md and the two plots into `output_dir`; returns their paths."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": folder / "results.json",
        "markdown": folder / "results.md",
        "acceptance_plot": folder / "acceptance_by_position.png",
        "speedup_plot": folder / "speedup_by_category.png",
    }
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    paths["markdown"].write_text(to_markdown(report))
    plot_acceptance_by_position(report, paths["acceptance_plot"])
    plot_speedup_by_category(report, paths["speedup_plot"])
    return paths


__all__ = ["DEFINITIONS", "SCHEMA", "build_report", "compare", "summarize", "to_markdown", "write_report"]
