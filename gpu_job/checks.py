"""GPU job stages that check outputs: greedy identity on tiny random models (fp32), and how often assisted greedy
output differs from plain greedy output with a real target in its own dtype (bf16 on the GPU).

Both run on the CPU too (tests/test_gpu_job_stages.py), through the same code.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

import carryover_hf  # noqa: F401  (installs the generate hook)
from carryover_hf.compatibility import ASSISTED_LOOP_CROPS_AT_EOS
from carryover_hf.generation import declare_generation_options
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


KINDS = ("dflash", "markov")
ARCHITECTURES = ("llama", "qwen3")
VOCAB = 16
# LM heads skewed towards one token make random target and drafter agree partly (0.1) or over long runs (1.0), so the
# check meets zero, partial and full acceptance (as tests/test_generation_greedy.py does).
SKEWS = (0.0, 0.1, 1.0)
BLOCKS = (4, 16)


def _prompt(i: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, VOCAB, (1, 1 + i % 11), generator=generator).to(device)  # (1, 1..11)


def _outcomes(stats) -> Counter:
    counts = Counter()
    for accepted, drafted in zip(stats.acceptance_lengths, stats.draft_lengths):
        counts["zero" if accepted == 1 else "full" if accepted == drafted + 1 else "partial"] += 1
    return counts


@torch.no_grad()
def greedy_identity(
    device: str, dtype: torch.dtype = torch.float32, num_prompts: int = 12, max_new_tokens: int = 32,
    deadline: float | None = None,
) -> dict:
    """Assisted greedy output vs the target's own greedy output on tiny random targets moved to `device`: both drafter
    kinds, carry on and off, `num_prompts` prompts each (every third one stops at an end-of-sequence token).

    Returns `{"results": {"<kind>/carry_on|carry_off": {"prompts", "identical", "eos_stops", "rounds",
    "mean_acceptance_length", "outcomes"}}, "all_identical", "mismatches", "skipped", "device", "dtype",
    "incomplete", ...}`; `deadline` (a `time.monotonic()` value) stops it cleanly between prompts.
    """
    targets = {
        arch: [skew_towards_token(tiny_target(arch, vocab_size=VOCAB, seed=1, dtype=dtype), 3, s) for s in SKEWS]
        for arch in ARCHITECTURES
    }
    drafters = {}
    results = {f"{kind}/carry_{'on' if carry else 'off'}": Counter() for kind in KINDS for carry in (True, False)}
    accepted = {name: [] for name in results}
    mismatches, skipped, incomplete = [], [], False
    for arch in targets:  # `declare_generation_options`: generate takes `use_carryover=` as a keyword
        targets[arch] = [declare_generation_options(t.to(device)) for t in targets[arch]]
    for i in range(num_prompts):
        for kind in KINDS:
            if deadline is not None and time.monotonic() > deadline:
                incomplete = True
                break
            arch = ARCHITECTURES[i % len(ARCHITECTURES)]
            skew = (i // len(ARCHITECTURES)) % len(SKEWS)
            block = BLOCKS[(i // 2) % len(BLOCKS)]
            target = targets[arch][skew]
            key = (arch, skew, kind, block)
            if key not in drafters:
                drafters[key] = tiny_drafter(target, block_size=block, drafter_type=kind, seed=2).to(device)
            drafter = drafters[key]
            prompt = _prompt(i, device)
            kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(prompt))
            reference = target.generate(prompt, **kwargs)
            eos_case = i % 3 == 1
            if eos_case:
                # Stop at EOS: declare a token the target emits mid-way as end-of-sequence.
                new_tokens = reference[0, prompt.shape[1] :]
                kwargs["eos_token_id"] = kwargs["pad_token_id"] = int(new_tokens[len(new_tokens) // 2])
                reference = target.generate(prompt, **kwargs)
                if not ASSISTED_LOOP_CROPS_AT_EOS and int(prompt[0, -1]) == kwargs["eos_token_id"]:
                    skipped.append({"prompt": i, "kind": kind, "why": "prompt ends with EOS (refused on 5.17)"})
                    continue
            for carry in (True, False):
                name = f"{kind}/carry_{'on' if carry else 'off'}"
                output = target.generate(prompt, assistant_model=drafter, use_carryover=carry, **kwargs)
                stats = drafter.last_generation_stats
                same = torch.equal(output, reference)
                results[name]["prompts"] += 1
                results[name]["identical"] += int(same)
                results[name]["eos_stops"] += int(eos_case and int(reference[0, -1]) == kwargs["eos_token_id"])
                results[name]["rounds"] += stats.num_rounds
                results[name].update({f"outcome_{k}": v for k, v in _outcomes(stats).items()})
                accepted[name].extend(stats.acceptance_lengths)
                if not same:
                    mismatches.append({"prompt": i, "name": name, "arch": arch, "block_size": block,
                                       "reference": reference[0].tolist(),
                                       "assisted": output[0].tolist()})  # fmt: skip
        if incomplete:
            break
    summary = {}
    for name, counts in results.items():
        summary[name] = {
            "prompts": counts["prompts"], "identical": counts["identical"], "eos_stops": counts["eos_stops"],
            "rounds": counts["rounds"],
            "mean_acceptance_length": sum(accepted[name]) / len(accepted[name]) if accepted[name] else 0.0,
            "outcomes": {k: counts[f"outcome_{k}"] for k in ("zero", "partial", "full")},
        }  # fmt: skip
    del drafters, targets
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "results": summary,
        "all_identical": all(s["identical"] == s["prompts"] for s in summary.values()),
        "mismatches": mismatches[:10],
        "skipped": skipped,
        "device": str(device),
        "device_name": torch.cuda.get_device_name() if str(device).startswith("cuda") else None,
        "dtype": str(dtype).removeprefix("torch."),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "max_new_tokens": max_new_tokens,
        "incomplete": incomplete,
    }


def _encode(tokenizer, prompt, chat_template: bool, device) -> torch.Tensor:
    """Token ids `(1, n)`: a text through the chat template (generation prompt added) or as is; ids pass through."""
    if not isinstance(prompt, str):
        return torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1).to(device)
    if chat_template:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
    return torch.tensor([ids], dtype=torch.long, device=device)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token of two generated sequences (the shorter one's length if one is a prefix of
    the other); None when they are equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def bf16_divergence(
    target, tokenizer, drafter, prompts: list, max_new_tokens: int, deadline: float, chat_template: bool = True
) -> dict:
    """Plain greedy `generate` vs assisted greedy `generate` per prompt, in the target's dtype, until `deadline` (a
    `time.monotonic()` value). Prompts are texts (chat-templated unless `chat_template=False`) or token-id lists.

    Returns `{"prompts_done", "prompts_total", "identical", "diverged", "first_divergence_positions" (index in the
    generated tokens, one per diverged prompt), "per_prompt", "errors", "plain_seconds", "assisted_seconds",
    "mean_acceptance_length", "dtype", "device", "incomplete"}`.
    """
    device = target.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    per_prompt, errors, positions = [], [], []
    clocks = {"plain": 0.0, "assisted": 0.0}
    accepted = []
    for index, prompt in enumerate(prompts):
        if time.monotonic() > deadline:
            break
        try:
            ids = _encode(tokenizer, prompt, chat_template, device)
            kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
            outputs = {}
            for name, extra in (("plain", {}), ("assisted", {"assistant_model": drafter})):
                sync()
                start = time.perf_counter()
                outputs[name] = target.generate(ids, **kwargs, **extra)[0, ids.shape[1] :].tolist()
                sync()
                clocks[name] += time.perf_counter() - start
        except Exception as error:  # noqa: BLE001  (recorded: one bad prompt must not end the stage)
            errors.append({"prompt": index, "error": f"{type(error).__name__}: {error}"})
            continue
        stats = drafter.last_generation_stats
        accepted.extend(stats.acceptance_lengths)
        first = _first_difference(outputs["plain"], outputs["assisted"])
        if first is not None:
            positions.append(first)
        per_prompt.append({
            "prompt": index, "identical": first is None, "first_divergence": first,
            "plain_new_tokens": len(outputs["plain"]), "assisted_new_tokens": len(outputs["assisted"]),
            "mean_acceptance_length": stats.mean_acceptance_length,
        })  # fmt: skip
    done = len(per_prompt) + len(errors)
    identical = sum(p["identical"] for p in per_prompt)
    return {
        "prompts_done": done,
        "prompts_total": len(prompts),
        "identical": identical,
        "diverged": len(per_prompt) - identical,
        "first_divergence_positions": positions,
        "per_prompt": per_prompt,
        "errors": errors,
        "plain_seconds": round(clocks["plain"], 3),
        "assisted_seconds": round(clocks["assisted"], 3),
        "mean_acceptance_length": sum(accepted) / len(accepted) if accepted else 0.0,
        "max_new_tokens": max_new_tokens,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(device),
        "incomplete": done < len(prompts),
    }


__all__ = ["bf16_divergence", "greedy_identity"]
