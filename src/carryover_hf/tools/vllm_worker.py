"""The vLLM side of `carryover-hf vllm`: run vLLM on token-id prompts and write what it generated.

Runs in the vLLM environment's python, as a script: `python vllm_worker.py REQUEST.json RESULT.json`. It imports
nothing from carryover_hf (that environment need not hold it), only the standard library and vLLM.
`vllm_check.run_vllm` writes the request and reads the result.

Request keys: `model` (target folder or Hub id), `prompts` (lists of token ids), `max_new_tokens`, and optionally
`speculative_config` (e.g. `{"method": "dflash", "model": EXPORT, "num_speculative_tokens": 3}`), `dtype` (float32),
`ignore_eos` (true), `enforce_eager` (true), `max_model_len` (2048), `batch` (also generate all prompts as one batch).

Greedy (temperature 0). The engine is built once and warmed up with one short request; then each prompt is generated
alone (batch 1) and timed, prefill included. The result holds per prompt the new token ids and seconds (and, with a
drafter, the drafts accepted and proposed at each verify step), the engine's start-up time, vLLM's speculative-decoding
counters over the timed requests, and, with `batch`, the batch's tokens and seconds.

`python vllm_worker.py --serve` keeps one engine for many requests (`vllm_check.VllmSession`, used by `carryover-hf
regenerate --decoder vllm`): JSON lines on stdin, one reply line per request on stdout (vLLM's own output, and that of
the processes it spawns, goes to stderr). The first line sets up the engine (`model`, `dtype`, `max_model_len`,
`max_num_seqs`, `enforce_eager`, `enable_chunked_prefill`) and is answered with `{"ready": true, "vllm_version": ...,
"startup_seconds": ...}`; each later line `{"prompts": [[ids]], "max_tokens": [n], "stop_token_ids": [ids],
"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seeds": [s] or null}` is generated as one `LLM.generate` call (vLLM
batches its requests itself) and answered with `{"outputs": [{"tokens", "finish_reason", "stop_reason"}], "seconds"}`;
`{"close": true}` or the end of stdin stops the engine. An error is answered with `{"error": traceback}`.

A drafter exported with carry (`carryover-hf convert --to vllm --carry`) needs carryover-hf's vLLM plugin: the caller
puts it on this process's `PYTHONPATH` (`vllm_check.plugin_dir`), and vLLM loads it in each of its processes.
"""

from __future__ import annotations

import json
import os
import sys
import time


# Run as a script, this file's folder (carryover_hf/tools) is sys.path[0]: its modules (cli, data, testing, ...) must
# not shadow top-level ones for vLLM. vLLM's spawned processes inherit this sys.path.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != _HERE]

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def _spec_counters(metrics: list) -> dict:
    """The speculative-decoding counters (`SPEC_COUNTERS`, and the accepted drafts per position) among vLLM's metrics
    (`LLM.get_metrics()`, `vllm.v1.metrics.reader.get_metrics_snapshot()`), summed over engines."""
    counters: dict = {name: 0 for name in SPEC_COUNTERS.values()}
    counters["accepted_per_position"] = []
    for metric in metrics:
        if metric.name in SPEC_COUNTERS:
            counters[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_position = counters["accepted_per_position"]
            per_position.extend([0] * (len(metric.values) - len(per_position)))
            for position, value in enumerate(metric.values):
                per_position[position] += int(value)
    return counters


def _difference(after: dict, before: dict) -> dict:
    diff = {key: after[key] - before[key] for key in SPEC_COUNTERS.values()}
    earlier = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    diff["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], earlier)]
    return diff


def _row(output) -> dict:
    """A request's new tokens and, with a drafter, the drafts accepted and proposed at each of its verify steps."""
    row = {"tokens": list(output.outputs[0].token_ids)}
    metrics = getattr(output.outputs[0], "spec_decode_metrics", None)
    if metrics is not None:
        row["accepted_per_step"] = list(metrics.per_step_accepted)
        row["drafted_per_step"] = list(metrics.per_step_drafted)
    return row


def _engine_kwargs(request: dict) -> dict:
    """The engine's keyword arguments of a `run` or `bench` request (its keys: see the module's docstring)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB; without it vLLM takes most of the machine's memory
    kwargs = {
        "model": request["model"],
        "dtype": request.get("dtype", "float32"),
        "enforce_eager": request.get("enforce_eager", True),
        "max_model_len": request.get("max_model_len", 2048),
        "seed": 0,
        "disable_log_stats": False,  # the speculative-decoding counters
    }
    if request.get("speculative_config"):
        kwargs["speculative_config"] = request["speculative_config"]
    return kwargs


def run(request: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = _engine_kwargs(request)
    if request.get("speculative_config"):
        kwargs["per_request_spec_decode_metrics"] = "detailed"  # accepted drafts of every verify step, per request
    start = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - start

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in request["prompts"]]
    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"],
                            ignore_eos=request.get("ignore_eos", True))  # fmt: skip
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = _spec_counters(llm.get_metrics())
    runs = []
    for prompt in prompts:  # batch 1
        start = time.perf_counter()
        output = llm.generate([prompt], params, use_tqdm=False)[0]
        runs.append({**_row(output), "seconds": time.perf_counter() - start})
    spec_decode = _difference(_spec_counters(llm.get_metrics()), before)
    result = {"startup_seconds": startup, "prompts": runs, "spec_decode": spec_decode}
    if request.get("batch"):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        rows = [_row(output) for output in outputs]
        result["batch"] = {"tokens": [row["tokens"] for row in rows], "seconds": seconds}
        if all("accepted_per_step" in row for row in rows):
            result["batch"]["accepted_per_step"] = [row["accepted_per_step"] for row in rows]
    import vllm

    result["vllm_version"] = vllm.__version__
    return result


def serve(requests, reply) -> int:
    """The `--serve` loop: one engine, one `generate` call per request line (see the module's docstring)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    import traceback

    answer = _json_lines(reply)

    try:
        setup = json.loads(requests.readline() or "{}")
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        import vllm

        kwargs = {"model": setup["model"], "dtype": setup.get("dtype", "float32"),
                  "enforce_eager": setup.get("enforce_eager", True), "max_model_len": setup.get("max_model_len", 2048),
                  "seed": setup.get("seed", 0),
                  # token ids in and out: vLLM needs no tokenizer, and stops only at the stop ids it is given
                  "skip_tokenizer_init": True}  # fmt: skip
        if setup.get("max_num_seqs"):
            kwargs["max_num_seqs"] = setup["max_num_seqs"]
        if setup.get("enable_chunked_prefill") is False:
            # prompts prefilled whole (needed for seeded sampling on CPU: vLLM 0.32 rewinds a request's generator
            # after a partial prefill, which a CPU generator cannot do: 'CPU Generator does not use offset')
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, kwargs["max_model_len"])
        start = time.perf_counter()
        llm = LLM(**kwargs)
        answer({"ready": True, "vllm_version": vllm.__version__, "startup_seconds": time.perf_counter() - start})
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it there
        answer({"error": traceback.format_exc()})
        return 1
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("close"):
            break
        try:
            seeds = request.get("seeds") or [None] * len(request["prompts"])
            params = [
                # ignore_eos: vLLM's own EOS is not used; it stops exactly at the stop ids the caller gives (the
                # token is kept in the output), or after max_tokens
                SamplingParams(temperature=request.get("temperature", 0.0), top_p=request.get("top_p", 1.0),
                               top_k=request.get("top_k", 0), seed=seed, max_tokens=max_tokens,
                               stop_token_ids=list(request["stop_token_ids"]), ignore_eos=True, detokenize=False)
                for max_tokens, seed in zip(request["max_tokens"], seeds)
            ]  # fmt: skip
            prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in request["prompts"]]
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            answer({"outputs": [{"tokens": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason,
                                 "stop_reason": o.outputs[0].stop_reason} for o in outputs],
                    "seconds": seconds})  # fmt: skip
        except Exception:  # noqa: BLE001
            answer({"error": traceback.format_exc()})
    try:  # stops (and waits for) the engine's process, whose CPU time then counts in this one's children
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - an older or newer vLLM: its exit handlers stop the engine
        pass
    return 0


async def _timed(engine, prompt, params, request_id: str) -> dict:
    """One request through `engine` (an `AsyncLLM`): its new tokens, and the seconds from now to its first and to its
    last token (the outputs stream cumulatively, one per step)."""
    start = time.perf_counter()
    first_token = None
    async for output in engine.generate(prompt, params, request_id):
        if first_token is None:
            first_token = time.perf_counter() - start
        final = output
    return {"tokens": list(final.outputs[0].token_ids), "latency": time.perf_counter() - start,
            "first_token": first_token}  # fmt: skip


async def _level(engine, prompts: list, params, concurrency: int) -> list[dict]:
    """All `prompts` submitted at once, at most `concurrency` of them in the engine at a time; `_timed`'s row each."""
    import asyncio

    slots = asyncio.Semaphore(concurrency)

    async def limited(index: int, prompt) -> dict:
        async with slots:
            return await _timed(engine, prompt, params, f"c{concurrency}-{index}")

    return list(await asyncio.gather(*(limited(index, prompt) for index, prompt in enumerate(prompts))))


async def _bench(request: dict, report) -> None:
    """`bench`'s engine and levels; the engine stops (and waits for its process) whatever happens."""
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.reader import get_metrics_snapshot

    levels = [int(c) for c in request["concurrency"]]
    kwargs = {**_engine_kwargs(request), "max_num_seqs": max(levels)}
    start = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    report({"ready": True, "vllm_version": vllm.__version__, "startup_seconds": time.perf_counter() - start})
    try:
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in request["prompts"]]
        params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"],
                                ignore_eos=request.get("ignore_eos", True))  # fmt: skip
        await _timed(engine, prompts[0], SamplingParams(temperature=0.0, max_tokens=8), "warm-up")
        for level in levels:
            # every level starts with a cold prefix cache: the same prompts came at the level before
            await engine.reset_prefix_cache()
            before = _spec_counters(get_metrics_snapshot())
            start = time.perf_counter()
            rows = await _level(engine, prompts, params, level)
            seconds = time.perf_counter() - start
            # the output handler records a step's counters before it yields to the requests it finished
            spec_decode = _difference(_spec_counters(get_metrics_snapshot()), before)
            report({"level": {"concurrency": level, "seconds": seconds, "requests": rows, "spec_decode": spec_decode}})
    finally:
        engine.shutdown(timeout=60)  # the engine's process gets a minute to end before it is killed


def bench(request: dict, report) -> int:
    """`--bench`: throughput and latency of one engine at each concurrency level (see the module's docstring);
    `report(message)` writes each message as it comes."""
    import asyncio

    asyncio.run(_bench(request, report))
    return 0


def _json_lines(stream):
    """A function writing each message it is given to `stream` as one JSON line, at once."""

    def write(message: dict) -> None:
        stream.write(json.dumps(message) + "\n")
        stream.flush()

    return write


def _reply_stream():
    """A stream to the real stdout, for this script's replies; from here on everything else written to stdout (vLLM's
    logs, prints of the processes it spawns, which inherit file descriptor 1) goes to stderr."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reply


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve(sys.stdin, _reply_stream())
    if len(argv) == 2 and argv[0] == "--bench":
        reply = _reply_stream()
        with open(argv[1]) as file:
            request = json.load(file)
        return bench(request, _json_lines(reply))
    if len(argv) != 2:
        print("usage: python vllm_worker.py REQUEST.json RESULT.json | --serve | --bench REQUEST.json",
              file=sys.stderr)
        return 2
    with open(argv[0]) as file:
        request = json.load(file)
    result = run(request)
    with open(argv[1], "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":  # vLLM's engine spawns processes, which import this file again as __mp_main__
    sys.exit(main(sys.argv[1:]))
