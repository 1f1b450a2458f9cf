"""A multi-turn workload for the suffix cache: does a cache shared across `generate` calls make the cost-aware policy
faster where requests repeat?

Tool-calling and code prompts of the held-out suite run in sequence, then a second pass runs the same requests
again with new phrasing (a different wording around the same user turn, as a user asking again would). Each prompt
runs three ways, back to back, starting at a different one each prompt:

* `target`: the target alone;
* `policy`: `round_policy="cost"` with a suffix match over this call's own sequence only;
* `policy+cache`: the same with one `SuffixCache` shared by every call of the run (`drafter.suffix_cache`), so that a
  call can draft from earlier prompts and outputs.

Greedy by default, so every output is checked against the target's (they must be identical). Writes `results.json`
(every run) and `results.md` (speedups per pass with paired 95 % bootstrap intervals over prompts, and the cache
against no cache) to `--output_dir`.

    python benchmarks/suffix_cache_multiturn.py --threads 1 --prompts_per_category 10 \
        --output_dir benchmarks/results/smollm2-135m-suffix-multiturn
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from carryover_hf.resources import shipped_drafters_dir
from carryover_hf.suffix_cache import SuffixCache
from carryover_hf.tools.bench import stats
from carryover_hf.tools.bench.prompts import default_suite_dir, encode_prompt, load_prompts
from carryover_hf.tools.bench.runner import BenchmarkSettings, Method, check_greedy_output, run_method
from carryover_hf.tools.cpu_kernels import apply_cpu_kernels, resolve_cpu_kernels

CATEGORIES = ("tool_calling", "code")
# The second pass asks the same thing in other words: the wording around the user's turn changes, the request not.
REPHRASINGS = (
    "Once more, please. {text}",
    "{text}\n\nCould you answer this again?",
    "I asked this before; here it is again: {text}",
    "{text}\n\nPlease redo this one.",
)
METHODS = ("target", "policy", "policy+cache")


def rephrase(prompt, index: int):
    """The prompt with its last user turn reworded (the `index`-th wording, cycling)."""
    wording = REPHRASINGS[index % len(REPHRASINGS)]
    if isinstance(prompt.text, str):
        return replace(prompt, id=prompt.id + "/again", text=wording.format(text=prompt.text))
    messages = [dict(m) for m in prompt.text]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last_user]["content"] = wording.format(text=messages[last_user]["content"])
    return replace(prompt, id=prompt.id + "/again", text=messages)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default=None,
                        help="A saved drafter folder (default: the shipped carryover-hf/smollm2-135m-carryover-markov).")
    parser.add_argument("--prompts_per_category", type=int, default=10)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu_kernels", default="auto")
    parser.add_argument("--output_dir", default="benchmarks/results/smollm2-135m-suffix-multiturn")
    args = parser.parse_args(argv)
    if args.prompts_per_category < 1 or args.max_new_tokens < 1 or args.threads < 1 or args.temperature < 0:
        parser.error("--prompts_per_category, --max_new_tokens and --threads must be positive, --temperature >= 0")
    if args.drafter is None:
        shipped = shipped_drafters_dir()
        if shipped is None:
            parser.error("no shipped drafters outside a source checkout: pass --drafter <folder>")
        args.drafter = str(shipped / "carryover-hf" / "smollm2-135m-carryover-markov")
    if not Path(args.drafter, "config.json").is_file():
        parser.error(f"--drafter {args.drafter}: no config.json there")
    return args


def summarize(runs: list[dict], resamples: int = 9999) -> dict:
    """Speedups over the target per pass and overall, and the cache against no cache, paired over prompts."""
    out = {}
    for scope in ("first", "second", "both"):
        chosen = [r for r in runs if scope == "both" or r["pass"] == scope]
        by = {m: sorted((r for r in chosen if r["method"] == m), key=lambda r: r["prompt_id"]) for m in METHODS}
        arrays = {m: (np.array([r["decode_tokens"] for r in rs], float), np.array([r["decode_time"] for r in rs], float))
                  for m, rs in by.items()}  # fmt: skip
        block = {}
        for a, b in (("policy", "target"), ("policy+cache", "target"), ("policy+cache", "policy")):
            interval = stats.bootstrap_interval([*arrays[a], *arrays[b]], stats.ratio_of_rates, n_resamples=resamples)
            block[f"{a} / {b}"] = interval.to_dict()
        for m in ("policy", "policy+cache"):
            lengths = [n for r in by[m] for n in r["acceptance_lengths"]]
            block[f"tau {m}"] = sum(lengths) / len(lengths) if lengths else None
            planning = sum(r["planning_time"] for r in by[m])
            block[f"planning ms per round {m}"] = 1000 * planning / max(1, len(lengths))
        step = sum(r["decode_time"] for r in by["target"]) / max(1, sum(r["decode_tokens"] for r in by["target"]))
        block["target step ms"] = 1000 * step
        block["prompts"] = len(by["target"])
        out[scope] = block
    return out


def markdown(summary: dict, info: dict) -> str:
    lines = [
        "# Suffix cache across calls: a multi-turn workload",
        "",
        f"{info['target']} + `{info['drafter']}`, {info['dtype']} on {info['device']}, {info['threads']} thread(s), "
        f"CPU kernels {info['cpu_kernels']}; {', '.join(CATEGORIES)} (held-out), {info['prompts_per_category']} "
        f"per category, then the same requests reworded; {info['max_new_tokens']} new tokens, T = {info['temperature']}. "
        f"Greedy outputs identical to the target alone: {info['all_identical']}. Speedup = decode throughput over "
        "the target alone on the same prompts; 95 % paired bootstrap intervals over prompts.",
        "",
        f"Command: `{info['command']}`",
        "",
        "| pass | prompts | policy / target | policy+cache / target | cache / no cache | τ policy | τ policy+cache "
        "| planning per round (share of a target step) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def fmt(d):
        return f"{d['estimate']:.2f}x [{d['ci_low']:.2f}, {d['ci_high']:.2f}]"

    for scope, label in (("first", "first"), ("second", "second (reworded)"), ("both", "both")):
        b = summary[scope]
        share = b["planning ms per round policy+cache"] / b["target step ms"]
        lines.append(
            f"| {label} | {b['prompts']} | {fmt(b['policy / target'])} | {fmt(b['policy+cache / target'])} "
            f"| {fmt(b['policy+cache / policy'])} | {b['tau policy']:.2f} | {b['tau policy+cache']:.2f} "
            f"| {b['planning ms per round policy+cache']:.2f} ms ({100 * share:.1f} %) |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from carryover_hf.hub.loading import load_drafter
    from carryover_hf.targets import load_target

    prompts = load_prompts(default_suite_dir(), list(CATEGORIES), "eval", args.prompts_per_category)
    workload = [(p, "first") for p in prompts] + [(rephrase(p, i), "second") for i, p in enumerate(prompts)]
    target, tokenizer = load_target(args.target, dtype="float32")
    drafter = load_drafter(args.drafter, target)
    kernels = resolve_cpu_kernels(args.cpu_kernels, target.dtype, target.device)
    if kernels:
        apply_cpu_kernels(target, drafter)
    target.eval()
    drafter.eval()
    settings = BenchmarkSettings(max_new_tokens=args.max_new_tokens, warmup=0, overhead=False)
    methods = {"target": Method("target", "target"), "policy": Method("policy", "policy", "d", drafter),
               "policy+cache": Method("policy+cache", "policy", "d", drafter)}  # fmt: skip
    shared = SuffixCache()

    def run(name: str, ids, seed: int, max_new_tokens: int | None = None):
        drafter.suffix_cache = shared if name == "policy+cache" else None
        try:
            return run_method(target, methods[name], ids, args.temperature, settings, seed, max_new_tokens)
        finally:
            drafter.suffix_cache = None

    warm = encode_prompt(prompts[0], tokenizer)
    for name in ("target", "policy"):  # untimed warm-up; the shared cache starts empty
        run(name, warm, args.seed, max_new_tokens=16)
    runs, started = [], time.time()
    for index, (prompt, pass_name) in enumerate(workload):
        ids = encode_prompt(prompt, tokenizer)
        order = METHODS[index % 3 :] + METHODS[: index % 3]
        outputs = {}
        for name in order:
            output, measured = run(name, ids, args.seed + index)
            outputs[name] = output
            runs.append({"prompt_id": prompt.id, "category": prompt.category, "pass": pass_name, "method": name,
                         "new_tokens": int(output.numel()), **{k: measured[k] for k in (
                             "decode_tokens", "decode_time", "total_time", "acceptance_lengths", "draft_lengths",
                             "planning_time")}})  # fmt: skip
        if args.temperature == 0:
            for name in ("policy", "policy+cache"):
                check = check_greedy_output(target, ids, outputs["target"], outputs[name], tolerance=0.0)
                runs[-3 + order.index(name)]["identical"] = check["identical"]
        print(f"[{index + 1}/{len(workload)}] {prompt.id} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

    info = {
        "target": args.target, "drafter": args.drafter, "dtype": "float32", "device": str(target.device),
        "threads": args.threads, "cpu_kernels": bool(kernels), "prompts_per_category": args.prompts_per_category,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
        "all_identical": all(r.get("identical", True) for r in runs),
        "command": "python benchmarks/suffix_cache_multiturn.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }  # fmt: skip
    summary = summarize(runs)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"info": info, "summary": summary, "runs": runs}, indent=1))
    (out / "results.md").write_text(markdown(summary, info))
    print(markdown(summary, info))
    return 0 if info["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
