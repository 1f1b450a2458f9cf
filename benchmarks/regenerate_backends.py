"""Response tokens per CPU-second of `carryover-hf regenerate` with the refill decoder and with vLLM, same prompts.

Each backend runs the real command (`carryover-hf regenerate`) in a subprocess into a scratch folder: the
first `--prompts` prompts of the training run's order (`--chunk_size N --max_chunks 1`, seed 0, all nine categories;
mt_bench's second turns included), fp32, one thread. Measured per run:

* CPU seconds (user + system) of every process involved: the command, and with vLLM its worker and engine processes,
  two ways that should agree: `getrusage(RUSAGE_CHILDREN)` around the command (processes that ended and were waited
  for), and the largest sum over the command's process tree read from /proc while it ran;
* the same without start-up (model load, vLLM's engine start): the sum of the chunks' `cpu_seconds`;
* wall seconds, and what else used the machine meanwhile (other processes' CPU seconds from /proc, the busiest
  named);
* response tokens, and how many rows the two backends made alike (greedy).

Writes `results-<max_new_tokens>.json` and `.md` under `--output` (default `benchmarks/results/regenerate-backends`).

    OMP_NUM_THREADS=1 python benchmarks/regenerate_backends.py --prompts 64 --max_new_tokens 256 \
        --vllm_python .cache/vllm-env/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "regenerate-backends"


def _all_process_ticks() -> dict[int, tuple[int, str]]:
    """pid -> (utime + stime ticks, name) of every process."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        found[int(name)] = (int(fields[11]) + int(fields[12]), text[text.index("(") + 1 : text.rindex(")")])
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return ""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(name: str, arguments: list[str], scratch: Path) -> dict:
    from carryover_hf.tools.vllm_check import process_tree_cpu_seconds

    output = scratch / name
    # the console script: it exits with the command's status (`python -m carryover_hf` exits 0 on errors)
    command = [str(Path(sys.executable).parent / "carryover-hf"), "regenerate", "--output", str(output), *arguments]
    ticks = os.sysconf("SC_CLK_TCK")
    before_all, children_before, started = _all_process_ticks(), _children_cpu(), time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tree, tree_pids = 0.0, {process.pid}
    while process.poll() is None:
        seconds = process_tree_cpu_seconds(process.pid)
        if seconds is not None:
            tree = max(tree, seconds)
        tree_pids |= _descendants(process.pid)
        time.sleep(0.5)
    log = process.stdout.read()
    wall = time.perf_counter() - started
    children = _children_cpu() - children_before
    after_all = _all_process_ticks()
    if process.returncode != 0:
        raise SystemExit(f"{name} failed ({process.returncode}):\n{log[-3000:]}")
    others = []
    for pid, (after, process_name) in after_all.items():
        if pid in tree_pids or pid == os.getpid():
            continue
        used = (after - before_all.get(pid, (0, ""))[0]) / ticks
        if used > 0.5:
            others.append({"pid": pid, "name": process_name, "command": _cmdline(pid), "cpu_seconds": round(used, 1)})
    others.sort(key=lambda entry: -entry["cpu_seconds"])
    state = json.loads((output / "regeneration.json").read_text())
    sidecars = [json.loads(path.read_text()) for path in sorted((output / "data").glob("chunk-*.json"))]
    summary = state["summary"]
    tokens = summary["response_tokens"]
    chunk_cpu = sum(stats["cpu_seconds"] for stats in sidecars)
    result = {
        "command": shlex.join(["carryover-hf", "regenerate", "--output", f"<scratch>/{name}", *arguments]),
        "response_tokens": tokens,
        "rows": summary["rows"],
        "unfinished": summary["unfinished"],
        "wall_seconds": round(wall, 1),
        "cpu_seconds_rusage": round(children, 1),
        "cpu_seconds_process_tree": round(tree, 1),
        "cpu_seconds_chunks": round(chunk_cpu, 1),
        "tokens_per_cpu_second": round(tokens / children, 1),
        "tokens_per_cpu_second_without_startup": round(tokens / chunk_cpu, 1),
        "tokens_per_wall_second": round(tokens / wall, 1),
        "other_processes_cpu_seconds": round(sum(entry["cpu_seconds"] for entry in others), 1),
        "other_processes": others[:3],
        "sidecars": [{k: v for k, v in stats.items() if k not in ("prompt_ids", "unfinished")} for stats in sidecars],
    }
    print(f"{name}: {tokens} tokens, {children:.1f} CPU-s ({tree:.1f} by /proc), {wall:.1f} s wall: "
          f"{result['tokens_per_cpu_second']} tok/CPU-s, without start-up "
          f"{result['tokens_per_cpu_second_without_startup']}", flush=True)  # fmt: skip
    return result


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(text[text.rindex(")") + 2 :].split()[1]), []).append(int(name))
    found, stack = set(), [pid]
    while stack:
        current = stack.pop()
        found.add(current)
        stack += children.get(current, [])
    return found


def _agreement(first: Path, second: Path) -> dict:
    from carryover_hf.regenerated import load_regenerated

    a, b = load_regenerated(first).to_list(), load_regenerated(second).to_list()
    same, differences = 0, []
    for x, y in zip(a, b, strict=True):
        if x["input_ids"] == y["input_ids"]:
            same += 1
            continue
        start = x["loss_mask"].index(1)
        first_difference = next((i for i, (p, q) in enumerate(zip(x["input_ids"], y["input_ids"])) if p != q),
                                min(len(x["input_ids"]), len(y["input_ids"])))  # fmt: skip
        differences.append({"id": x["id"], "first_difference_in_response": first_difference - start})
    return {"rows": len(a), "identical": same, "differences": differences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="the first N prompts of the run order (one chunk)")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=64, help="refill's batch and vLLM's max_num_seqs")
    parser.add_argument("--vllm_python", default=None, help="python of the vLLM environment")
    parser.add_argument("--backends", nargs="+", default=["refill", "vllm", "vllm-t1"],
                        choices=["refill", "vllm", "vllm-t1", "refill-t1"])  # fmt: skip
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()

    common = ["--target", "smollm2-135m", "--dtype", "float32", "--split", "train", "--max_new_tokens",
              str(args.max_new_tokens), "--max_length", "2048", "--chunk_size", str(args.prompts), "--max_chunks", "1",
              "--batch_size", str(args.batch_size), "--num_threads", "1"]  # fmt: skip
    sampled = ["--do_sample", "--temperature", "1.0", "--seed", "1"]
    vllm = ["--decoder", "vllm"]
    if args.vllm_python:
        vllm += ["--vllm_python", str(Path(args.vllm_python).absolute())]
    arguments = {"refill": common, "vllm": common + vllm, "refill-t1": common + sampled,
                 "vllm-t1": common + vllm + sampled}  # fmt: skip
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results = {}
    with tempfile.TemporaryDirectory(prefix="regenerate-backends-") as scratch:
        for name in args.backends:
            results[name] = measure(name, arguments[name], Path(scratch))
        agreement = (_agreement(Path(scratch) / "refill", Path(scratch) / "vllm")
                     if {"refill", "vllm"} <= set(results) else None)  # fmt: skip
    import torch
    import transformers

    record = {
        "command": "OMP_NUM_THREADS=1 python " + shlex.join(["benchmarks/regenerate_backends.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                     "dtype": "float32", "threads": 1},  # fmt: skip
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_before": load_before,
                    "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                 if line.startswith("model name")), None)},  # fmt: skip
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "vllm": next((r["sidecars"][0].get("vllm") for r in results.values() if r["sidecars"]
                                   and r["sidecars"][0].get("vllm")), None)},  # fmt: skip
        "results": results,
        "greedy_agreement_refill_vs_vllm": agreement,
    }
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    stem = f"results-{args.max_new_tokens}"
    (output / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    machine = record["machine"]
    lines = [f"`{record['command']}` ({record['date']}; {machine['cpu']}, {machine['cpus']} cores)", "",
             f"First {args.prompts} prompts of the training run's order, up to {args.max_new_tokens} new tokens per "
             "turn, fp32, one thread. CPU seconds: user + system of every process of the command (vLLM's worker and "
             "engine included), from getrusage(RUSAGE_CHILDREN); 'without start-up' sums the chunks' cpu_seconds "
             "(no model load, no engine start).", "",
             "| backend | response tokens | CPU s | tok / CPU-s | tok / CPU-s without start-up | wall s | "
             "tok / wall-s | other processes' CPU s meanwhile |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, result in results.items():
        lines.append(f"| {name} | {result['response_tokens']} | {result['cpu_seconds_rusage']} | "
                     f"{result['tokens_per_cpu_second']} | {result['tokens_per_cpu_second_without_startup']} | "
                     f"{result['wall_seconds']} | {result['tokens_per_wall_second']} | "
                     f"{result['other_processes_cpu_seconds']} |")  # fmt: skip
    if agreement:
        where = [d["first_difference_in_response"] for d in agreement["differences"]]
        lines += ["", f"Greedy rows identical between refill and vLLM: {agreement['identical']} of {agreement['rows']}"
                  + (f"; first differences at response tokens {where}" if where else "") + "."]  # fmt: skip
    busiest = {entry["command"] or entry["name"] for r in results.values() for entry in r["other_processes"][:1]}
    if busiest:
        lines += ["", "Busiest other process meanwhile: " + "; ".join(f"`{name}`" for name in sorted(busiest)) + "."]
    (output / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
