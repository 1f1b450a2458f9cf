"""Do vLLM's batched greedy answers equal the committed greedy rows of a regeneration run?

For the first `--rows` rows of each chunk given, every generated turn is asked of vLLM again from the same context (the
row's tokens before the turn: a second turn follows the committed first answer), all turns of all chunks in one
`generate` call (batched by vLLM, at most `--batch_size` at a time), greedy, with the run's budget (`max_new_tokens`,
cut to what `max_length` leaves) and stop ids. Each turn is compared token for token with the committed one. At each
first difference the target's fp32 logits are computed by Transformers at batch 1 from the common prefix: the gap
between the committed token's and vLLM's token's logits says whether the two were a near-tie, and which of them batch-1
Transformers picks. (This session uses vLLM's default chunked prefill; `--resume_chunk` below goes through
`carryover-hf regenerate --decoder vllm`, which prefills each prompt whole.)

With `--resume_chunk K`, the run itself is also continued with vLLM: its state and chunks 0..K-1 are copied into a
scratch folder and `carryover-hf regenerate --decoder vllm --max_chunks 1` with the run's own settings writes chunk K
there (every turn conditioned on vLLM's own earlier answers, as in a real run); its rows are compared with the
committed chunk K, and its sidecar gives the chunk's response tokens per CPU-second (all processes, engine start
excluded).

    OMP_NUM_THREADS=1 python benchmarks/regenerate_vllm_agreement.py --run assets/train/smollm2-135m --chunks 0 2 \
        --rows 32 --resume_chunk 2 --vllm_python .cache/vllm-env/bin/python
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "regenerate-backends"


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    from carryover_hf.regenerated import response_spans

    return response_spans(mask)


def near_tie(target, prefix: list[int], committed_id: int, vllm_id: int) -> dict:
    """The target's fp32 logits after `prefix`, by Transformers at batch 1: the two tokens' logits and their gap, the
    gap between the best two logits, and which token batch-1 Transformers picks."""
    import torch

    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([prefix]), logits_to_keep=1).logits[0, -1].float()
    top2 = torch.topk(logits, 2)
    return {
        "committed_token": committed_id, "vllm_token": vllm_id,
        "committed_logit": float(logits[committed_id]), "vllm_logit": float(logits[vllm_id]),
        "logit_gap": abs(float(logits[committed_id] - logits[vllm_id])),
        "transformers_batch1_argmax": int(top2.indices[0]), "top2_gap": float(top2.values[0] - top2.values[1]),
    }  # fmt: skip


def resume_chunk(run: Path, chunk: int, vllm_python: str | None, batch_size: int) -> dict:
    """Continues a copy of `run` at chunk `chunk` with `--decoder vllm`; compares the chunk with the committed one."""
    import shutil
    import subprocess
    import tempfile

    import pyarrow.parquet as pq

    from carryover_hf.regenerated import DATA_DIR, STATE_FILE, chunk_path

    identity = json.loads((run / STATE_FILE).read_text())["identity"]
    with tempfile.TemporaryDirectory(prefix="regenerate-resume-") as scratch:
        copy = Path(scratch) / "run"
        (copy / DATA_DIR).mkdir(parents=True)
        shutil.copy(run / STATE_FILE, copy / STATE_FILE)
        for index in range(chunk):
            for suffix in (".parquet", ".json"):
                shutil.copy(chunk_path(run, index).with_suffix(suffix), chunk_path(copy, index).with_suffix(suffix))
        options = ["--target", identity["target"], "--dtype", identity["dtype"], "--split", identity["split"],
                   "--categories", *identity["categories"], "--max_new_tokens", str(identity["max_new_tokens"]),
                   "--max_length", str(identity["max_length"]), "--chunk_size", str(identity["chunk_size"]),
                   "--seed", str(identity["seed"]), "--batch_size", str(batch_size), "--num_threads", "1",
                   "--decoder", "vllm", "--max_chunks", "1"]  # fmt: skip
        if vllm_python:
            options += ["--vllm_python", str(Path(vllm_python).absolute())]
        command = [str(Path(sys.executable).parent / "carryover-hf"), "regenerate", "--output", str(copy), *options]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"regenerate failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        stats = json.loads(chunk_path(copy, chunk).with_suffix(".json").read_text())
        ours = pq.read_table(chunk_path(copy, chunk)).to_pylist()
    committed = pq.read_table(chunk_path(run, chunk)).to_pylist()
    committed_stats = json.loads(chunk_path(run, chunk).with_suffix(".json").read_text())
    differences = []
    for a, b in zip(ours, committed, strict=True):
        if a["input_ids"] != b["input_ids"] or a["loss_mask"] != b["loss_mask"] or a["finished"] != b["finished"]:
            start = b["loss_mask"].index(1)
            k = next((i for i, (x, y) in enumerate(zip(a["input_ids"], b["input_ids"])) if x != y),
                     min(len(a["input_ids"]), len(b["input_ids"])))  # fmt: skip
            entry = {"id": a["id"], "first_difference_in_response": k - start, "prefix": b["input_ids"][:k]}
            if k < min(len(a["input_ids"]), len(b["input_ids"])):
                entry |= {"committed_token": b["input_ids"][k], "vllm_token": a["input_ids"][k]}
            differences.append(entry)
    other_columns_equal = all({k: v for k, v in a.items() if k != "generation"}
                              == {k: v for k, v in b.items() if k != "generation"}
                              for a, b in zip(ours, committed))  # fmt: skip
    return {
        "command": shlex.join(["carryover-hf", "regenerate", "--output", "<copy of the run, chunks 0..K-1>",
                               *options]),
        "chunk": chunk, "rows": len(ours), "identical_rows": len(ours) - len(differences),
        "all_columns_but_generation_equal": other_columns_equal, "differences": differences,
        "response_tokens": stats["response_tokens"], "seconds": stats["seconds"], "cpu_seconds": stats["cpu_seconds"],
        "vllm_cpu_seconds": stats["vllm_cpu_seconds"], "vllm_startup_seconds": stats.get("vllm_startup_seconds"),
        "vllm_startup_cpu_seconds": stats.get("vllm_startup_cpu_seconds"), "command_wall_seconds": round(wall, 1),
        "tokens_per_cpu_second": round(stats["response_tokens"] / stats["cpu_seconds"], 1),
        "committed": {"decoder": committed_stats.get("decoder"), "seconds": committed_stats["seconds"],
                      "cpu_seconds": committed_stats.get("cpu_seconds"),
                      "tokens_per_cpu_second": round(committed_stats["response_tokens"]
                                                     / committed_stats["cpu_seconds"], 1)
                      if committed_stats.get("cpu_seconds") else None},
    }  # fmt: skip


def write_markdown(record: dict, output: Path) -> None:
    """`agreement.md` from the record (also printed)."""
    lines = [f"`{record['command']}` ({record['date']}, vLLM {record['vllm']})", "",
             "| chunk (made by) | identical rows | identical turns | tokens before the first difference / committed |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for chunk, entry in record["chunks"].items():
        lines.append(f"| {chunk} ({entry['made_by']}) | {entry['identical_rows']} / {entry['rows']} | "
                     f"{entry['identical_turns']} / {entry['turns']} | "
                     f"{entry['tokens_before_first_difference']} / {entry['committed_tokens']} |")  # fmt: skip
    lines += ["", "| chunk | row | turn | first difference (token) | logit gap committed vs vLLM token | top-2 gap | "
              "batch-1 Transformers picks |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for chunk, entry in record["chunks"].items():
        for e in entry["differences"]:
            lines.append(f"| {chunk} | {e['id']} | {e['turn']} | {e['first_difference']} | {_gap(e, 'logit_gap')} | "
                         f"{_gap(e, 'top2_gap')} | {_picks(e)} |")  # fmt: skip
    if "resumed" in record:
        r, c = record["resumed"], record["resumed"]["committed"]
        lines += ["", f"The run continued at chunk {r['chunk']} with vLLM (`{r['command']}`): {r['identical_rows']} "
                  f"of {r['rows']} rows identical to the committed chunk (all columns but `generation` equal: "
                  f"{r['all_columns_but_generation_equal']}); {r['response_tokens']} response tokens in "
                  f"{r['cpu_seconds']} CPU-s of all processes ({r['tokens_per_cpu_second']} per CPU-second), "
                  f"{r['seconds']} s wall, engine "
                  f"start {r['vllm_startup_seconds']} s ({r['vllm_startup_cpu_seconds']} CPU-s) not included. The "
                  f"committed chunk ({c['decoder']}): {c['cpu_seconds']} CPU-s, {c['tokens_per_cpu_second']} per "
                  f"CPU-second, {c['seconds']} s wall (another day's load)."]  # fmt: skip
        if r["differences"]:
            lines += ["", "| resumed chunk: row | first difference (response token) | logit gap committed vs vLLM "
                      "token | top-2 gap | batch-1 Transformers picks |",
                      "| --- | --- | --- | --- | --- |"]  # fmt: skip
            for e in r["differences"]:
                lines.append(f"| {e['id']} | {e['first_difference_in_response']} | {_gap(e, 'logit_gap')} | "
                             f"{_gap(e, 'top2_gap')} | {_picks(e)} |")  # fmt: skip
    if record.get("note"):
        lines += ["", f"Note: {record['note']}."]
    (output / "agreement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _gap(e: dict, key: str) -> str:
    return f"{e[key]:.2g}" if key in e else "-"


def _picks(e: dict) -> str:
    if "transformers_batch1_argmax" not in e:
        return "-"
    pick = e["transformers_batch1_argmax"]
    return "committed" if pick == e["committed_token"] else "vLLM" if pick == e["vllm_token"] else "neither"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="assets/train/smollm2-135m")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rows", type=int, default=32, help="the first N rows of each chunk")
    parser.add_argument("--batch_size", type=int, default=64, help="vLLM's max_num_seqs")
    parser.add_argument("--vllm_python", default=None)
    parser.add_argument("--resume_chunk", type=int, default=None, help="also continue the run at this chunk with vLLM")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import torch

    from carryover_hf.regenerated import STATE_FILE, chunk_path
    from carryover_hf.targets import load_target, prepare_smollm2
    from carryover_hf.tools.data.regenerate import _stop_ids
    from carryover_hf.tools.vllm_check import VllmSession, find_vllm_python

    torch.set_num_threads(1)
    run = Path(args.run)
    identity = json.loads((run / STATE_FILE).read_text())["identity"]
    assert identity["target"] == "smollm2-135m" and identity["dtype"] == "float32" and not identity["do_sample"]
    max_new_tokens, max_length = identity["max_new_tokens"], identity["max_length"]
    target, tokenizer = load_target("smollm2-135m", dtype="float32")
    stop_ids = _stop_ids(target, tokenizer)

    turns = []  # (chunk, row id, turn index, context, committed tokens, budget)
    decoders = {}
    for chunk in args.chunks:
        path = chunk_path(run, chunk)
        decoders[chunk] = json.loads(path.with_suffix(".json").read_text()).get("decoder", "generate (batch 32)")
        table = pq.read_table(path, columns=["id", "input_ids", "loss_mask"]).slice(0, args.rows).to_pylist()
        for row in table:
            for turn, (start, end) in enumerate(_spans(row["loss_mask"])):
                turns.append((chunk, row["id"], turn, row["input_ids"][:start], row["input_ids"][start:end],
                              min(max_new_tokens, max_length - start)))  # fmt: skip

    started = time.perf_counter()
    with VllmSession(find_vllm_python(args.vllm_python), prepare_smollm2(), max_model_len=max_length,
                     max_num_seqs=args.batch_size) as session:  # fmt: skip
        outputs = session.generate([t[3] for t in turns], [t[5] for t in turns], stop_token_ids=sorted(stop_ids))
        version, seconds = session.vllm_version, session.last_seconds
    total = time.perf_counter() - started
    print(f"vLLM {version}: {len(turns)} turns in {seconds:.1f} s (engine and all: {total:.1f} s)")

    results = []
    for (chunk, row_id, turn, context, committed, budget), output in zip(turns, outputs, strict=True):
        ours = output["tokens"]
        entry = {"chunk": chunk, "id": row_id, "turn": turn, "committed_tokens": len(committed),
                 "vllm_tokens": len(ours), "identical": ours == committed}  # fmt: skip
        if ours != committed:
            k = next((i for i, (a, b) in enumerate(zip(ours, committed)) if a != b), min(len(ours), len(committed)))
            entry["first_difference"] = k
            if k < min(len(ours), len(committed)):
                entry |= near_tie(target, context + committed[:k], committed[k], ours[k])
            else:  # one is a prefix of the other: only where a budget or stop differs
                entry["prefix_of_the_other"] = True
        results.append(entry)

    rows: dict[tuple, bool] = {}
    for entry in results:
        rows[(entry["chunk"], entry["id"])] = rows.get((entry["chunk"], entry["id"]), True) and entry["identical"]
    per_chunk = {}
    for chunk in args.chunks:
        mine = [e for e in results if e["chunk"] == chunk]
        differing = [e for e in mine if not e["identical"]]
        per_chunk[chunk] = {
            "made_by": decoders[chunk],
            "rows": sum(1 for key in rows if key[0] == chunk),
            "identical_rows": sum(same for key, same in rows.items() if key[0] == chunk),
            "turns": len(mine),
            "identical_turns": len(mine) - len(differing),
            "committed_tokens": sum(e["committed_tokens"] for e in mine),
            "tokens_before_first_difference": sum(e.get("first_difference", e["committed_tokens"]) for e in mine),
            "differences": differing,
        }
    record = {
        "command": "OMP_NUM_THREADS=1 python "
        + shlex.join(["benchmarks/regenerate_vllm_agreement.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "run": str(run), "vllm": version, "max_new_tokens": max_new_tokens, "max_length": max_length,
        "chunks": per_chunk,
    }  # fmt: skip
    if args.resume_chunk is not None:
        resumed = record["resumed"] = resume_chunk(run, args.resume_chunk, args.vllm_python, args.batch_size)
        for entry in resumed["differences"]:
            prefix = entry.pop("prefix")
            if "vllm_token" in entry:
                entry |= near_tie(target, prefix, entry["committed_token"], entry["vllm_token"])
        print(f"chunk {args.resume_chunk} made again by vLLM: {resumed['identical_rows']} of {resumed['rows']} rows "
              f"identical, {resumed['tokens_per_cpu_second']} response tokens per CPU-second", flush=True)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "agreement.json").write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(record, output)


if __name__ == "__main__":
    main()
