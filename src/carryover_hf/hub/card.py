"""Model cards for drafters: Hub metadata, target, training, evaluation table and a runnable usage snippet."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..configuration_carryover import PROPOSAL_DEFAULTS, CarryoverDrafterConfig
from ..resources import MODEL_CARD_TEMPLATE as DEFAULT_TEMPLATE

LIBRARY_NAME = "transformers"
PIPELINE_TAG = "text-generation"
# How the card names the proposal defaults a drafter is published with (its generation_config.json).
PROPOSAL_DEFAULT_LABELS = {
    "lookup_drafts": "context lookup of {} tokens in front of the drafter",
    "lookup_backoff": "lookup backoff {}",
    "proposal_backoff": "proposal backoff {}",
    "draft_confidence_threshold": "adaptive proposal length at {}",
}
COST_POLICY_LABEL = ("cost-aware round policy (`round_policy=\"cost\"`: each round's source and number of drafts chosen "
                     "by expected tokens per unit of cost on the machine it runs on)")
BASE_TAGS = ("carryover-hf", "speculative-decoding", "dflash", "block-diffusion", "draft-model")


def _interval(value: Any, interval: Any, digits: int, suffix: str = "") -> str:
    """`6.53 [6.41, 6.65]` (a confidence interval when known), `—` when the value is missing.

    A bench group of one prompt has no bootstrap interval (its bounds are None): the value is shown alone."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{float(value):.{digits}f}{suffix}"
    if interval and all(bound is not None for bound in interval):
        low, high = interval
        text += f" [{float(low):.{digits}f}, {float(high):.{digits}f}]"
    return text


def format_evaluation(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Rows for the card's evaluation table.

    Each row needs `category` and may carry `acceptance_length`, `acceptance_length_ci` (`[low, high]`), `speedup` and
    `speedup_ci`. Unknown keys are rejected so that a typo does not silently drop a number from the card.
    """
    known = {"category", "acceptance_length", "acceptance_length_ci", "speedup", "speedup_ci"}
    table = []
    for i, row in enumerate(rows):
        unknown = set(row) - known
        if unknown or "category" not in row:
            raise ValueError(
                f"Evaluation row {i} must have 'category' and only the keys {sorted(known)}; "
                f"got unknown keys {sorted(unknown)}" + ("" if "category" in row else " and no 'category'")
            )
        table.append(
            {
                "category": str(row["category"]),
                "acceptance_length": _interval(row.get("acceptance_length"), row.get("acceptance_length_ci"), 2),
                "speedup": _interval(row.get("speedup"), row.get("speedup_ci"), 2, "x"),
            }
        )
    return table


def evaluation_from_bench(report: Mapping[str, Any], method: str, temperature: float = 0.0) -> list[dict[str, Any]]:
    """Evaluation rows for the card from a `carryover-hf bench` report (`results.json`): one per category, then
    `all`, with the per-prompt mean acceptance length and the decode speedup, each with its confidence interval."""
    by_temperature = {float(entry["temperature"]): entry for entry in report.get("results", [])}
    if float(temperature) not in by_temperature:
        raise ValueError(f"the bench report has no results at temperature {temperature}; it has {sorted(by_temperature)}")
    summary = by_temperature[float(temperature)]["summary"]
    if method not in summary:
        raise ValueError(f"the bench report has no method {method!r}; it has {sorted(summary)}")
    rows = []
    for group, stats in sorted(summary[method].items(), key=lambda item: (item[0] == "all", item[0])):
        row: dict[str, Any] = {"category": group}
        for key, source in (("acceptance_length", "acceptance_length_per_prompt"), ("speedup", "speedup")):
            if stats.get(source):
                row[key] = stats[source]["estimate"]
                row[f"{key}_ci"] = [stats[source]["ci_low"], stats[source]["ci_high"]]
        rows.append(row)
    return rows


def default_objective(config: CarryoverDrafterConfig) -> str:
    if config.trained_with_carryover:
        return (
            "draft-verify-draft (Carryover): the second proposal after a parallel verification pass is trained with "
            "the verified states of rejected drafts as carry rows, tagged with the learned vector E_carry."
        )
    return (
        "DFlash block objective: random anchors in target-generated responses, blocks `[anchor, MASK...]`, "
        "cross-entropy weighted by exp(-(j-1)/gamma)."
    )


def render_model_card(
    config: CarryoverDrafterConfig,
    repo_id: str | None = None,
    *,
    base_model: str | None = None,
    evaluation: Sequence[Mapping[str, Any]] | None = None,
    evaluation_note: str | None = None,
    training_data: str | None = None,
    objective: str | None = None,
    license: str = "apache-2.0",
    tags: Sequence[str] = (),
    export_format: str | None = None,
    template_path: str | Path | None = None,
    generation_config: Any = None,
) -> ModelCard:
    """Render the drafter's model card (`README.md`) from the shipped template (`resources.MODEL_CARD_TEMPLATE`).

    Args:
        config: the drafter's config; target, layout and carryover flags are read from it.
        repo_id: where the drafter lives on the Hub (used in the usage snippet); a local path works too.
        base_model: the target's Hub id for the metadata; defaults to `config.target_name_or_path`.
        evaluation: rows for the evaluation table, see [`format_evaluation`].
        training_data / objective: free text; the objective defaults to the one `config.trained_with_carryover` names.
        export_format: `"speculators"` renders the card of a vLLM speculators export (vLLM usage; with carry when
            the generation config's `use_carryover` is on, as `export_speculators(carry=True)` passes it).
        generation_config: the drafter's `generation_config` (a `GenerationConfig` or a dict): the proposal defaults
            a generate call starts from (`PROPOSAL_DEFAULTS`); default: those an old config.json held, else none.
    """
    template = Path(template_path) if template_path is not None else DEFAULT_TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(
            f"Model card template {template} not found; pass template_path= (the template ships in the package, "
            "carryover_hf/assets/model_cards/)."
        )
    from .. import __version__

    target = base_model or config.target_name_or_path
    markov = config.drafter_type == "markov"
    kind = "markov" if markov else "dflash"
    card_tags = [*BASE_TAGS, f"carryover-{kind}", *tags]
    if export_format == "speculators":
        card_tags.append("speculators")
    card_data = ModelCardData(
        base_model=target if target and not Path(target).exists() else None,
        library_name=LIBRARY_NAME,
        pipeline_tag=PIPELINE_TAG,
        license=license,
        tags=list(dict.fromkeys(card_tags)),
    )
    imported = getattr(config, "imported_from", None) or {}
    imported_text = ""
    if imported:
        imported_text = f"`{imported.get('source')}` ({imported.get('format')} checkpoint)"
        if imported.get("sliding_window"):
            imported_text += (
                f"; its sliding-window layers (window {imported['sliding_window']}) run with full attention here"
            )
    if markov:
        head = f"DFlash backbone + rank-{config.markov_rank} first-order token-transition head"
        if config.markov_input_vocab_size:
            head += f"; its input table has a row for each of {config.markov_input_vocab_size:,} ids and one shared row"
        drafter_kind = f"Markov ({head})"
    else:
        drafter_kind = "DFlash (block diffusion, one forward pass per proposal)"
    defaults = {**PROPOSAL_DEFAULTS, **getattr(config, "legacy_proposal_defaults", {})}
    if generation_config is not None:
        saved = generation_config if isinstance(generation_config, Mapping) else generation_config.to_dict()
        defaults.update({k: saved[k] for k in PROPOSAL_DEFAULTS if k in saved})
    if defaults["use_carryover"]:
        carryover = "on: rejected drafts' target states are carried into the next proposal"
    else:
        carryover = "off: drafts as plain DFlash (`E_carry` unused)"
    carryover += "; trained with carryover" if config.trained_with_carryover else "; not trained with carryover"
    proposal_defaults = None  # a speculators export is served by vLLM with its own options
    if export_format != "speculators":
        set_defaults = {name: defaults[name] for name in PROPOSAL_DEFAULT_LABELS}
        proposal_defaults = "; ".join(PROPOSAL_DEFAULT_LABELS[k].format(v) for k, v in set_defaults.items() if v)
        if defaults["round_policy"] == "cost":
            proposal_defaults = COST_POLICY_LABEL + (f"; with `round_policy=\"rules\"`: {proposal_defaults}"
                                                     if proposal_defaults else "")  # fmt: skip
    title = (repo_id.rstrip("/").split("/")[-1] if repo_id else "Carryover drafter") + (
        " (vLLM speculators export)" if export_format == "speculators" else ""
    )
    summary = (
        f"A {'Markov' if markov else 'DFlash'} drafter for speculative decoding with "
        + (f"`{target}`" if target else "its target model")
        + ". It reads the target's hidden states and proposes a block of tokens per round; with Carryover it also "
        "reuses the target's states at the drafts the target rejected in the previous round."
    )
    license_text = (
        f"This checkpoint is released under `{license}`. Using it requires the target model"
        + (f" `{target}`" if target else "")
        + ", whose own licence applies to it."
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        title=title,
        summary=summary,
        repo_id=repo_id or "PATH_OR_REPO_ID",
        target=target,
        drafter_kind=drafter_kind,
        markov=markov,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        target_layer_ids=list(config.target_layer_ids),
        block_size=config.block_size,
        num_drafts=config.block_size - 1,
        mask_token_id=config.mask_token_id,
        draft_vocab_size=getattr(config, "draft_vocab_size", None),
        carryover=carryover,
        carry=bool(defaults["use_carryover"]),
        proposal_defaults=proposal_defaults,
        imported_from=imported_text,
        training_data=training_data or "not recorded",
        objective=objective or default_objective(config),
        evaluation=format_evaluation(evaluation) if evaluation else None,
        evaluation_note=evaluation_note
        or "τ = mean accepted tokens per verification round (bonus included); speedup = decode throughput over the "
        "target alone. Brackets: confidence intervals where measured.",
        export_format=export_format,
        license_text=license_text,
        version=__version__,
    )


def _parse_interval(text: str) -> tuple[float | None, list[float] | None]:
    """The inverse of `_interval`: `6.53 [6.41, 6.65]` (or `1.47x [...]`) -> (6.53, [6.41, 6.65]); `—` -> (None,
    None)."""
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text)]
    if not numbers:
        return None, None
    return numbers[0], numbers[1:3] if len(numbers) == 3 else None


def card_inputs(text: str) -> dict[str, Any]:
    """What a card rendered by `render_model_card` was given beyond the drafter's files (its config and generation
    config): `repo_id`, `base_model`, `license`, extra `tags`, `training_data`, `objective`, `export_format`, the
    `evaluation` rows and `evaluation_note`; read back from its text so that `refresh_model_card` re-renders it."""
    card = ModelCard(text)
    data = card.data.to_dict()
    body = card.text
    inputs: dict[str, Any] = {"base_model": data.get("base_model"), "license": data.get("license", "apache-2.0")}
    known = {*BASE_TAGS, "carryover-dflash", "carryover-markov", "speculators"}
    inputs["tags"] = [tag for tag in data.get("tags") or () if tag not in known]
    inputs["export_format"] = "speculators" if "speculators" in (data.get("tags") or ()) else None
    repo = re.search(r'AutoModel\.from_pretrained\("([^"]+)"', body) or re.search(r'"model": "([^"]+)"', body)
    inputs["repo_id"] = repo.group(1) if repo and repo.group(1) != "PATH_OR_REPO_ID" else None
    for key, label in (("training_data", "Data"), ("objective", "Objective")):
        found = re.search(rf"^\* \*\*{label}:\*\* (.*)$", body, re.M)
        inputs[key] = found.group(1) if found and found.group(1) != "not recorded" else None
    section = re.search(r"^## Evaluation\n\n(.*?)\n\n\| Category \|[^\n]*\n\| ---[^\n]*\n(.*?)\n\n", body, re.M | re.S)
    inputs["evaluation"] = inputs["evaluation_note"] = None
    if section:
        inputs["evaluation_note"] = section.group(1)
        rows = []
        for line in section.group(2).splitlines():
            category, tau, speedup = (cell.strip() for cell in line.strip().strip("|").split("|"))
            row: dict[str, Any] = {"category": category}
            for key, cell in (("acceptance_length", tau), ("speedup", speedup)):
                value, interval = _parse_interval(cell)
                if value is not None:
                    row[key] = value
                if interval is not None:
                    row[f"{key}_ci"] = interval
            rows.append(row)
        inputs["evaluation"] = rows
    return inputs


def refresh_model_card(folder: str | Path, template_path: str | Path | None = None) -> ModelCard:
    """Re-render the card (`README.md`) of a saved drafter folder from the current template, keeping what the card was
    rendered with (`card_inputs`: repo id, training text, evaluation table, notes, metadata) and reading the drafter's
    config.json and generation_config.json; returns the card (`.save(folder / "README.md")` writes it).

    For cards made by `carryover-hf push --dry-run` (the shipped drafters'), when the template changes: the bench
    results and notes they were rendered from need not be at hand."""
    folder = Path(folder)
    config = CarryoverDrafterConfig.from_json_file(folder / "config.json")
    saved = folder / "generation_config.json"
    generation_config = json.loads(saved.read_text()) if saved.is_file() else None
    inputs = card_inputs((folder / "README.md").read_text(encoding="utf-8"))
    return render_model_card(config, generation_config=generation_config, template_path=template_path, **inputs)


__all__ = ["DEFAULT_TEMPLATE", "card_inputs", "format_evaluation", "refresh_model_card", "render_model_card"]
