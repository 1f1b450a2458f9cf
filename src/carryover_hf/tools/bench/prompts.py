"""Benchmark prompts: JSONL files or the suite folder built by `carryover-hf prompts build`, tokenised for the target.

A line holds `prompt` (a string, or a list of chat messages), or `turns` (user turns, with an optional `system`
message: the suite format), or `input_ids` (token ids, for tokenizer-less targets); `category` defaults to "default";
`split` and `id` are optional. A suite folder (default: the shipped suites, `default_suite_dir()`) holds
`<split>/<category>.jsonl`.

Multi-turn prompts are benchmarked on their first user turn (with the system message); the report counts them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...resources import PROMPT_SUITES_DIR
from ...resources import resolve_prompt_suite as resolve_suite

@dataclass
class Prompt:
    """One benchmark prompt. `text` is a string or a list of chat messages; `input_ids` bypasses the tokenizer."""

    id: str
    category: str = "default"
    text: str | list[dict[str, str]] | None = None
    input_ids: list[int] | None = None
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def default_suite_dir() -> Path:
    """The prompt suites shipped with the package (`resources.PROMPT_SUITES_DIR`)."""
    return PROMPT_SUITES_DIR


def _row_to_prompt(row: Any, where: str, default_id: str) -> Prompt:
    if not isinstance(row, dict) or not any(k in row for k in ("prompt", "turns", "input_ids")):
        raise ValueError(f"{where}: each line needs `prompt` (text or chat messages), `turns` or `input_ids`")
    text = row.get("prompt")
    meta = {k: v for k, v in row.items() if k not in {"id", "category", "split", "prompt", "input_ids", "turns", "system"}}
    if text is None and row.get("turns") is not None:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: `turns` must be a non-empty list of strings")
        text = ([{"role": "system", "content": row["system"]}] if row.get("system") else []) + [
            {"role": "user", "content": turns[0]}
        ]
        meta["num_turns"] = len(turns)
    return Prompt(
        id=str(row.get("id", default_id)),
        category=str(row.get("category", "default")),
        text=text,
        input_ids=row.get("input_ids"),
        split=row.get("split"),
        meta=meta,
    )


def _read_jsonl(path: Path) -> list[Prompt]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None
            prompts.append(_row_to_prompt(row, f"{path}:{number}", f"{path.stem}-{number}"))
    return prompts


def load_prompts(
    path: str | Path,
    categories: Sequence[str] | None = None,
    split: str | None = None,
    num_per_category: int | None = None,
) -> list[Prompt]:
    """Read a JSONL file or a suite folder, keep `split` and `categories`, and take the first `num_per_category`
    prompts of each category.

    A suite folder is read from its `<split>/` subfolder (default `eval`), one `<category>.jsonl` per category. Raises a
    `ValueError` naming the line for a malformed line, and when a category has fewer prompts than asked.
    """
    path = resolve_suite(str(path))
    if path.is_dir():
        split = split or "eval"
        folder = path / split
        available = sorted(p.stem for p in folder.glob("*.jsonl"))
        if not available:
            raise ValueError(f"{path} has no {split}/<category>.jsonl files (splits: {sorted(p.name for p in path.iterdir() if p.is_dir())})")
        unknown = [c for c in categories or () if c not in available]
        if unknown:
            raise ValueError(f"{folder} has no category {unknown}; categories present: {available}")
        prompts = [p for c in (categories or available) for p in _read_jsonl(folder / f"{c}.jsonl")]
        for prompt in prompts:
            prompt.split = prompt.split or split
        return select_prompts(prompts, categories, split, num_per_category, source=str(folder))
    return select_prompts(_read_jsonl(path), categories, split, num_per_category, source=str(path))


def select_prompts(
    prompts: Sequence[Prompt],
    categories: Sequence[str] | None = None,
    split: str | None = None,
    num_per_category: int | None = None,
    source: str = "prompts",
) -> list[Prompt]:
    """Filter by split and category, then keep the first `num_per_category` prompts of each category, in file order."""
    if split is not None:
        splits = sorted({str(p.split) for p in prompts})
        prompts = [p for p in prompts if p.split == split]
        if not prompts:
            raise ValueError(f"{source} has no prompts in split {split!r}; splits present: {splits}")
    available = Counter(p.category for p in prompts)
    if categories:
        unknown = [c for c in categories if c not in available]
        if unknown:
            raise ValueError(f"{source} has no category {unknown}; categories present: {sorted(available)}")
        prompts = [p for p in prompts if p.category in set(categories)]
    if num_per_category is not None:
        short = {c: n for c, n in available.items() if n < num_per_category and (not categories or c in categories)}
        if short:
            raise ValueError(
                f"{source} has fewer than {num_per_category} prompts in categories {short}; "
                "lower --num-prompts or pick other categories."
            )
        taken: Counter = Counter()
        kept = []
        for prompt in prompts:
            if taken[prompt.category] < num_per_category:
                kept.append(prompt)
                taken[prompt.category] += 1
        prompts = kept
    if not prompts:
        raise ValueError(f"{source}: no prompts left to benchmark.")
    ids = Counter(p.id for p in prompts)
    duplicates = [i for i, n in ids.items() if n > 1]
    if duplicates:
        raise ValueError(f"{source}: prompt ids must be unique, repeated: {duplicates[:5]}")
    return list(prompts)


def encode_prompt(prompt: Prompt, tokenizer=None, chat_template: bool = True) -> torch.LongTensor:
    """Token ids `(1, n)` of a prompt: its `input_ids`, else its text through the tokenizer's chat template.

    A plain string becomes one user turn when the tokenizer has a chat template (and `chat_template` is on).
    """
    if prompt.input_ids is not None:
        ids = list(prompt.input_ids)
    elif prompt.text is None:
        raise ValueError(f"prompt {prompt.id!r} has neither text nor input_ids")
    elif tokenizer is None:
        raise ValueError(f"prompt {prompt.id!r} is text but the target has no tokenizer; give `input_ids` instead")
    elif chat_template and getattr(tokenizer, "chat_template", None):
        messages = prompt.text if isinstance(prompt.text, list) else [{"role": "user", "content": prompt.text}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = list(encoded["input_ids"])
    else:
        if isinstance(prompt.text, list):
            raise ValueError(f"prompt {prompt.id!r} is a chat but the tokenizer has no chat template")
        ids = tokenizer(prompt.text, add_special_tokens=True)["input_ids"]
    if not ids:
        raise ValueError(f"prompt {prompt.id!r} encodes to no tokens")
    return torch.tensor([ids], dtype=torch.long)


def tiny_prompts(num_prompts: int = 4, vocab_size: int = 64, length: int = 12, seed: int = 0) -> list[Prompt]:
    """Token-id prompts for tiny random targets, in two categories; each repeats a short motif so that prompt lookup
    has n-grams to find."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(num_prompts):
        motif = torch.randint(0, vocab_size, (4,), generator=generator).tolist()
        noise = torch.randint(0, vocab_size, (length - 8,), generator=generator).tolist()
        prompts.append(Prompt(id=f"tiny-{i}", category=("repeat", "mixed")[i % 2], input_ids=motif + noise + motif))
    return prompts


__all__ = ["Prompt", "default_suite_dir", "encode_prompt", "load_prompts", "resolve_suite", "select_prompts", "tiny_prompts"]
