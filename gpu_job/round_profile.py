"""GPU job stage: where the time of one speculative round goes, on a Qwen3-4B-shaped target with a z-lab-shaped
drafter (random weights, nothing downloaded), and the speedup those times predict at a given acceptance length tau.

Per context length L (milliseconds, medians after warm-up, the device synchronised around each timed call):
    step       the target's 1-token decode step on an L-token cache (what plain decoding pays per token)
    verify16   the target's forward over 16 new tokens on that cache (a round's verification of a 16-row block)
    proposal   one drafter proposal with 0 and with 15 carry rows (`bench.overhead.RecordedRound`: generate's code)
    rest       what Transformers' assisted loop spends per round outside drafting and verification, from a real
               `generate(..., carryover_timing=True)`
    speedup(tau) = tau * step / (verify16 + proposal + rest)
"""

from __future__ import annotations

import gc
import statistics
import time

import torch


BLOCK_SIZE = 16
TAUS = (3.0, 4.0, 5.0, 6.5, 8.0)
ZLAB_TAU_QWEN3_4B = 6.5  # z-lab's published mean acceptance length of their Qwen3-4B drafter
QWEN3_4B = dict(
    hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000,
    max_position_embeddings=40960, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)  # fmt: skip
ZLAB_LAYER_IDS = [1, 9, 17, 25, 33]


def _build(shape: str, device: str, dtype: torch.dtype, max_positions: int):
    """(target, drafter) with random weights, on `device` in `dtype`, in eval mode."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
    from carryover_hf.tools.testing import tiny_drafter, tiny_target

    if shape == "tiny":
        target = tiny_target("qwen3", vocab_size=256, max_position_embeddings=max_positions, dtype=dtype).to(device)
        return target, tiny_drafter(target, num_hidden_layers=1, block_size=BLOCK_SIZE).to(device)
    if shape != "qwen3-4b":
        raise ValueError(f"shape must be 'qwen3-4b' or 'tiny', got {shape!r}")
    config = Qwen3Config(**QWEN3_4B)
    with torch.device(device):  # built (and initialised) on the device: no 8 GB copy from the CPU
        target = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    drafter_config = CarryoverDrafterConfig.from_target_config(
        target.config, num_hidden_layers=5, block_size=BLOCK_SIZE, target_layer_ids=ZLAB_LAYER_IDS
    )
    drafter_config._attn_implementation = "sdpa"
    with torch.device(device):
        drafter = CarryoverDrafterModel(drafter_config)
    return target.eval(), drafter.to(dtype).eval()


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _time_verify(target, cache, tokens, length: int, indices, sync) -> float:
    """Milliseconds of one target forward over `tokens` `(1, 16)` on an `length`-token cache, hidden states of the
    drafter's layers recorded as in generate's verification; the cache is cropped back afterwards."""
    sync()
    start = time.perf_counter()
    target(tokens, past_key_values=cache, use_cache=True, output_hidden_states=indices)
    sync()
    elapsed = (time.perf_counter() - start) * 1000.0
    cache.crop(-tokens.shape[1])  # negative: tokens removed (Transformers 5.23+ refuses a positive length)
    if cache.get_seq_length() != length:
        raise RuntimeError(f"the target cache holds {cache.get_seq_length()} tokens after cropping, not {length}")
    return elapsed


def _generate_times(target, drafter, prompt, new_tokens: int, sync) -> dict:
    """One assisted greedy `generate` with timing: wall and the statistics' parts, in milliseconds."""
    sync()
    start = time.perf_counter()
    target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter,
                    max_new_tokens=new_tokens, do_sample=False, carryover_timing=True)  # fmt: skip
    sync()
    wall = (time.perf_counter() - start) * 1000.0
    stats = drafter.last_generation_stats
    parts = {"prefill": stats.prefill_time * 1000.0, "drafting": stats.drafting_time * 1000.0,
             "verification": stats.verification_time * 1000.0}  # fmt: skip
    return {"wall": wall, **parts, "rest": wall - sum(parts.values()), "rounds": stats.num_rounds,
            "mean_acceptance_length": stats.mean_acceptance_length}  # fmt: skip


PLAIN_TRIES = 3  # plain generate calls per length; the fastest is kept


def _plain_ms(target, prompt, new_tokens: int, sync) -> float:
    sync()
    start = time.perf_counter()
    target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False)
    sync()
    return (time.perf_counter() - start) * 1000.0


def _speedups(row: dict, rest: float | None) -> dict | None:
    """Predicted speedup per tau: over the target's bare step, and over plain generate's measured time per token."""
    if any(row.get(key) is None for key in ("verify16_ms", "proposal_ms_with_carry", "target_step_ms")):
        return None
    round_ms = row["verify16_ms"] + row["proposal_ms_with_carry"] + (rest or 0.0)
    out = {"round_ms": round(round_ms, 4), "rest_ms_used": rest,
           "over_step": {str(tau): round(tau * row["target_step_ms"] / round_ms, 3) for tau in TAUS}}
    if row.get("generate_round_ms") is not None:  # the whole round as generate timed it (random drafts: 15 a round)
        out["over_step_generate_round"] = {
            str(tau): round(tau * row["target_step_ms"] / row["generate_round_ms"], 3) for tau in TAUS
        }
    if row.get("plain_generate_ms_per_token") is not None:
        out["over_plain_generate"] = {
            str(tau): round(tau * row["plain_generate_ms_per_token"] / round_ms, 3) for tau in TAUS
        }
    return out


def _markdown(result: dict) -> str:
    def cell(value):
        return "–" if value is None else f"{value:.2f}"

    lines = [
        f"Round profile: {result['shape']} target ({result['target']['parameters'] / 1e9:.2f} B parameters), "
        f"{result['drafter']['num_hidden_layers']}-layer drafter, block {BLOCK_SIZE}, {result['dtype']}, "
        f"{result['device_name']}; torch {result['torch']}, transformers {result['transformers']}; medians of "
        f"{result['repeats']} (ms){' — INCOMPLETE' if result['incomplete'] else ''}",
        "",
        "| L | target step | verify 16 | proposal, no carry | proposal, 15 carried | rest per round | plain generate "
        "per token | generate round | rounds timed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["by_context_length"]:
        lines.append(
            f"| {row['context_length']} | {cell(row.get('target_step_ms'))} | {cell(row.get('verify16_ms'))} | "
            f"{cell(row.get('proposal_ms_without_carry'))} | {cell(row.get('proposal_ms_with_carry'))} | "
            f"{cell(row.get('rest_ms_per_round'))} | {cell(row.get('plain_generate_ms_per_token'))} | "
            f"{cell(row.get('generate_round_ms'))} | {row.get('generate', {}).get('rounds', '–')} |"
        )
    lines += ["", "Predicted speedup = tau x step / (verify 16 + proposal with carry + rest) (z-lab's Qwen3-4B tau: "
              f"{ZLAB_TAU_QWEN3_4B}); in brackets, over plain generate's time per token instead of the bare step. "
              "'generate round': wall time per round of an assisted generate call (prefill excluded).", "",
              "| L | " + " | ".join(f"tau {tau:g}" for tau in TAUS) + " |",
              "|---:|" + "---:|" * len(TAUS)]  # fmt: skip
    for row in result["by_context_length"]:
        speedup = row.get("predicted_speedup")
        if not speedup:
            continue
        plain = speedup.get("over_plain_generate", {})
        cells = [f"{speedup['over_step'][str(t)]:.2f}" + (f" ({plain[str(t)]:.2f})" if plain else "") for t in TAUS]
        lines.append(f"| {row['context_length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@torch.no_grad()
def round_profile(
    device: str,
    dtype: torch.dtype,
    shape: str,
    deadline: float,
    context_lengths=(512, 2048),
    repeats: int = 20,
    warmup: int = 3,
    generate_tokens: tuple[int, int] = (16, 64),
) -> dict:
    """Times a speculative round's parts at each context length (see the module docstring); stops at `deadline` (a
    `time.monotonic()` value) with what it has and `"incomplete": True`. Timings in milliseconds.

    `generate_tokens`: new tokens of the two timed `generate` calls per length; rest per round is the longer call's
    unattributed time over its rounds, and `rest_ms_per_round_marginal` the difference of the two calls' (no fixed
    per-call cost).
    """
    import transformers

    from carryover_hf.tools.bench.overhead import RecordedRound, record_features
    from carryover_hf.features import hidden_state_indices
    from carryover_hf.generation import declare_generation_options
    from carryover_hf.utils import device_synchronizer

    cuda = str(device).startswith("cuda")
    result = {
        "shape": shape, "device": str(device), "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "block_size": BLOCK_SIZE, "repeats": repeats, "warmup": warmup, "context_lengths": list(context_lengths),
        "taus": list(TAUS), "zlab_tau_qwen3_4b": ZLAB_TAU_QWEN3_4B, "by_context_length": [], "incomplete": False,
    }  # fmt: skip

    def late() -> bool:
        result["incomplete"] = result["incomplete"] or time.monotonic() > deadline
        return result["incomplete"]

    target = drafter = round_ = ids = features = None
    try:
        if late():
            return result
        started = time.perf_counter()
        max_positions = max(context_lengths) + max(generate_tokens) + 4 * BLOCK_SIZE
        target, drafter = _build(shape, device, dtype, max_positions)
        declare_generation_options(target)  # generate takes `carryover_timing=` as a keyword
        sync = device_synchronizer(device)
        sync()
        text = target.config
        result["build_seconds"] = round(time.perf_counter() - started, 2)
        result["target"] = {
            "architecture": type(target).__name__, "parameters": sum(p.numel() for p in target.parameters()),
            "hidden_size": text.hidden_size, "num_hidden_layers": text.num_hidden_layers,
            "vocab_size": text.vocab_size, "attn_implementation": text._attn_implementation,
        }  # fmt: skip
        result["drafter"] = {
            "drafter_type": drafter.config.drafter_type, "num_hidden_layers": drafter.config.num_hidden_layers,
            "block_size": drafter.config.block_size, "target_layer_ids": list(drafter.config.target_layer_ids),
            "parameters": sum(p.numel() for p in drafter.parameters()),
        }  # fmt: skip
        if late():
            return result

        # One recorded sequence for every length (causal: the states before L do not depend on what follows).
        generator = torch.Generator().manual_seed(0)
        token_ids = torch.randint(0, text.vocab_size, (1, max(context_lengths) + BLOCK_SIZE), generator=generator)
        ids, features = record_features(target, drafter, token_ids.to(device))  # (1, n), (1, n, 5 * H)
        head = drafter.draft_head(target.get_output_embeddings())
        indices = hidden_state_indices(drafter.config.target_layer_ids)
        warmed_generate = False
        for length in context_lengths:
            if late():
                break
            row = {"context_length": int(length)}
            result["by_context_length"].append(row)
            # (a) + (c): target step, then a proposal (no carry / 15 carried rows, taking turns to go first).
            round_ = RecordedRound(target, drafter, head, ids, features, length, new_context_rows=1)
            steps, proposals = [], {False: [], True: []}
            for repeat in range(warmup + repeats):
                if late():
                    break
                for with_carry in (False, True) if repeat % 2 == 0 else (True, False):
                    step_ms, proposal_ms = round_.time(with_carry)
                    if repeat >= warmup:
                        steps.append(step_ms)
                        proposals[with_carry].append(proposal_ms)
            round_.check()
            row.update(target_step_ms=_median(steps), proposal_ms_without_carry=_median(proposals[False]),
                       proposal_ms_with_carry=_median(proposals[True]), samples=len(steps))  # fmt: skip
            # (b) verification of a 16-row block on the same L-token cache.
            block = ids[:, length : length + BLOCK_SIZE]  # (1, 16)
            verify = []
            for repeat in range(warmup + repeats):
                if late():
                    break
                elapsed = _time_verify(target, round_.target_cache, block, length, indices, sync)
                if repeat >= warmup:
                    verify.append(elapsed)
            row["verify16_ms"] = _median(verify)
            round_ = None
            # (d) the rest of Transformers' loop per round, from real generate calls on a random L-token prompt.
            prompt = torch.randint(0, text.vocab_size, (1, length), generator=generator).to(device)
            per_token = sum(row[key] or 0.0 for key in ("verify16_ms", "proposal_ms_with_carry", "target_step_ms"))
            needed = (1 + PLAIN_TRIES) * sum(generate_tokens) * per_token / 1000.0 + 2.0  # assisted and plain calls, a margin
            if late() or time.monotonic() + needed > deadline:
                row["generate_skipped"] = f"about {needed:.0f} s needed, {deadline - time.monotonic():.0f} s left"
            else:
                if not warmed_generate:
                    _generate_times(target, drafter, prompt, 8, sync)
                    _plain_ms(target, prompt, 8, sync)
                    warmed_generate = True
                short, long = (_generate_times(target, drafter, prompt, n, sync) for n in generate_tokens)
                row["generate"] = {k: round(v, 4) for k, v in long.items()}
                rounds = max(long["rounds"], 1)
                row["rest_ms_per_round"] = round(long["rest"] / rounds, 4)
                # generate's own split of a round: drafting includes its bookkeeping (features, carry, buffer).
                row["generate_round_ms"] = round((long["wall"] - long["prefill"]) / rounds, 4)
                row["generate_drafting_ms_per_round"] = round(long["drafting"] / rounds, 4)
                row["generate_verification_ms_per_round"] = round(long["verification"] / rounds, 4)
                if long["rounds"] > short["rounds"]:
                    marginal = (long["rest"] - short["rest"]) / (long["rounds"] - short["rounds"])
                    row["rest_ms_per_round_marginal"] = round(marginal, 4)
                # Per token: a difference of two calls, each the fastest of PLAIN_TRIES (one call apiece made the
                # difference negative when another process shared the CPU).
                plain = [min(_plain_ms(target, prompt, n, sync) for _ in range(PLAIN_TRIES)) for n in generate_tokens]
                extra_tokens = generate_tokens[1] - generate_tokens[0]
                row["plain_generate_ms_per_token"] = round((plain[1] - plain[0]) / extra_tokens, 4)
        # Predicted speedups; a length whose generate calls were skipped borrows the nearest measured rest.
        measured = [r for r in result["by_context_length"] if r.get("rest_ms_per_round") is not None]
        for row in result["by_context_length"]:
            nearest = lambda r: abs(r["context_length"] - row["context_length"])  # noqa: E731
            source = min(measured, key=nearest) if measured else None
            rest = source["rest_ms_per_round"] if source else None
            row["rest_from_context_length"] = source["context_length"] if source else None
            row["predicted_speedup"] = _speedups(row, rest)
        if cuda:
            result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        return result
    finally:
        del target, drafter, round_, ids, features
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        result["markdown"] = _markdown(result) if "target" in result else "Round profile: not measured (no time).\n"


__all__ = ["round_profile"]
