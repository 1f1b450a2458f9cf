"""Reading rows: training text the target only reads (one forward pass), never answers.

Regeneration pays one target decode step per response token (49 tokens per CPU-second on the 2-core CPU, batch 64);
a row the target only *reads* costs one batched forward over all its tokens, the same pass `carryover-hf features`
makes anyway. With the target's own next-token distribution at every position as the label (the top-k
log-probabilities the feature store keeps, trained with `distillation_weight=1`: KL only, no cross-entropy to the
text's tokens), such rows teach the drafter the target's predictions on text the target did not write, as EAGLE
trained on fixed data.

The rows come from the train prompts a regeneration run has *not* answered (so a reading set never repeats a
regenerated row, and never touches a held-out one), in the run's order (each category shuffled by the seed,
interleaved round-robin, so any prefix covers every category):

* the prompt's first user turn, in the target's chat template (later turns presuppose an answer);
* for the categories whose reference is prose the target could have written (`PROSE_REFERENCES`: the English of a
  translation, the summary of a summarization prompt), the reference as the assistant turn.

`loss_mask` is 1 on the content tokens (the user turn; the reference and the EOS that ends it), 0 on the
template's own text (a row without a reference ends with the user turn's content). Written as one parquet file
(`input_ids`, `loss_mask`, `id`, `category`, `has_reference`) with a JSON sidecar (settings, rows and read tokens per
category), which `carryover-hf features --dataset` reads as it is:

```bash
carryover-hf prompts reading --after assets/train/smollm2-135m --rows 720 --output runs/reading.parquet
carryover-hf features --target smollm2-135m --dataset runs/reading.parquet --output runs/features-reading \\
    --target_layer_ids 1 8 14 20 27 --top_k 32 --dtype bfloat16
```
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from .suites import CATEGORIES, PROMPTS_DIR

# References that are text the target could have written as its answer; the other categories' references are keys
# (a number for math, a HumanEval task id for code, a tool name for tool calling) or absent.
PROSE_REFERENCES = ("translation", "summarization")
SIDECAR_SUFFIX = ".json"
_SENTINEL = "\u2063CARRYOVER_READ_CONTENT\u2063"


def _split_on_sentinels(text: str, count: int) -> list[str]:
    pieces = text.split(_SENTINEL)
    if len(pieces) != count + 1:
        raise ValueError("the chat template does not render message contents verbatim; cannot mark the read text")
    return pieces


def reading_row(tokenizer, prompt: dict, use_reference: bool) -> tuple[list[int], list[int]]:
    """`input_ids` and `loss_mask` of one prompt read by the target: its first user turn, plus its reference as the
    assistant turn when `use_reference`. The template's text is tokenized piece by piece around the contents, so the
    mask marks exactly the content tokens."""
    turn = prompt["turns"][0]
    system = prompt.get("system")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": _SENTINEL}]
    contents = [turn]
    if use_reference:
        messages.append({"role": "assistant", "content": _SENTINEL})
        contents.append(prompt["reference"])
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    pieces = _split_on_sentinels(text, len(contents))
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for index, content in enumerate(contents):
        template_ids = tokenizer(pieces[index], add_special_tokens=False)["input_ids"]
        content_ids = tokenizer(content, add_special_tokens=False)["input_ids"]
        input_ids += template_ids + content_ids
        loss_mask += [0] * len(template_ids) + [1] * len(content_ids)
    if use_reference:  # the target ends its answer with EOS: read it too
        input_ids.append(tokenizer.eos_token_id)
        loss_mask.append(1)
    return input_ids, loss_mask


def answered_ids(run: str | os.PathLike) -> set[str]:
    """Prompt ids a regeneration run has answered (its finished chunks' rows)."""
    from ...regenerated import load_regenerated

    return set(load_regenerated(run)["id"])


def reading_rows(
    tokenizer, prompts: list[dict], rows: int, skip: set[str] = frozenset(), max_length: int | None = None
) -> tuple[list[dict], dict]:
    """The first `rows` reading rows of `prompts` (in order), leaving out the ids in `skip` and prompts longer than
    `max_length` tokens (counted, never truncated). Returns `(records, summary)`."""
    records, summary = [], {"skipped_answered": 0, "skipped_too_long": 0}
    for prompt in prompts:
        if len(records) == rows:
            break
        if prompt["id"] in skip:
            summary["skipped_answered"] += 1
            continue
        use_reference = prompt["category"] in PROSE_REFERENCES and bool(prompt.get("reference"))
        input_ids, loss_mask = reading_row(tokenizer, prompt, use_reference)
        if max_length is not None and len(input_ids) > max_length:
            summary["skipped_too_long"] += 1
            continue
        records.append({"id": prompt["id"], "category": prompt["category"], "has_reference": use_reference,
                        "input_ids": input_ids, "loss_mask": loss_mask})  # fmt: skip
    if len(records) < rows:
        raise ValueError(
            f"only {len(records)} reading rows are left after the answered and too-long prompts; ask for --rows "
            f"{len(records)} or fewer."
        )
    tokens = Counter()
    for record in records:
        tokens[record["category"]] += sum(record["loss_mask"])
    summary.update(rows=len(records), read_tokens=sum(tokens.values()),
                   tokens=sum(len(r["input_ids"]) for r in records),
                   read_tokens_per_category=dict(sorted(tokens.items())),
                   rows_with_reference=sum(r["has_reference"] for r in records))  # fmt: skip
    return records, summary


def write_reading(records: list[dict], summary: dict, settings: dict, output: str | os.PathLike) -> Path:
    """One parquet file of the rows (written to a temporary name, then renamed) and its JSON sidecar."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("id", pa.string()), ("category", pa.string()), ("has_reference", pa.bool_()),
                        ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])  # fmt: skip
    staging = output.with_name(output.name + ".partial")
    pq.write_table(pa.Table.from_pylist(records, schema=schema), staging, compression="zstd")
    os.replace(staging, output)
    sidecar = output.with_name(output.name + SIDECAR_SUFFIX)
    sidecar.write_text(json.dumps({"settings": settings, "summary": summary}, indent=2) + "\n")
    return output


def build_reading(args) -> Path:
    """`carryover-hf prompts reading`: checks the arguments, then builds and writes the rows."""
    from .regenerate import RegenerationConfig, ordered_prompts

    output = Path(args.output)
    if output.suffix != ".parquet":
        raise ValueError(f"--output {output} must be a .parquet file")
    if args.rows < 1:
        raise ValueError(f"--rows must be positive, got {args.rows}")
    skip = answered_ids(args.after) if args.after else set()
    from ...targets import load_target_tokenizer

    tokenizer = load_target_tokenizer(args.target)
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer of {args.target!r} has no chat template; reading rows are chat-formatted")
    prompts = ordered_prompts(RegenerationConfig(output="", prompts_dir=str(args.prompts_dir), seed=args.seed,
                                                 categories=list(args.categories)))  # fmt: skip
    records, summary = reading_rows(tokenizer, prompts, args.rows, skip, args.max_length)
    settings = {"target": args.target, "prompts_dir": str(args.prompts_dir), "seed": args.seed,
                "categories": list(args.categories), "after": args.after, "rows": args.rows,
                "max_length": args.max_length, "prose_references": list(PROSE_REFERENCES)}  # fmt: skip
    write_reading(records, summary, settings, output)
    return output


def add_parser(sub) -> None:
    """The `reading` subcommand of `carryover-hf prompts`."""
    reading = sub.add_parser("reading", help="rows of train prompts the target only reads (no regeneration)")
    reading.add_argument("--output", required=True, help="the .parquet file to write (a JSON sidecar goes beside it)")
    reading.add_argument("--rows", type=int, required=True, help="reading rows to write")
    reading.add_argument("--after", default=None,
                         help="regeneration run folder(s) whose answered prompts are left out (comma-separated)")
    reading.add_argument("--target", default="smollm2-135m", help="target whose tokenizer and chat template to use")
    reading.add_argument("--prompts-dir", type=Path, default=PROMPTS_DIR)
    reading.add_argument("--seed", type=int, default=0, help="prompt order seed (a regeneration run's --seed)")
    reading.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES, metavar="CATEGORY")
    reading.add_argument("--max-length", type=int, default=2048, help="leave out (never truncate) longer rows")
