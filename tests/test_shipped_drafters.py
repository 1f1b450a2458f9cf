"""The drafters committed under drafters/ are complete Hub repos: they load by repo id from a local Hub cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModel

from carryover_hf import CarryoverDrafterModel
from carryover_hf.configuration_carryover import PROPOSAL_DEFAULTS as OPTIONS
from carryover_hf.hub.card import COST_POLICY_LABEL
from carryover_hf.tools.demo import DEFAULT_DRAFTER, SHIPPED_DRAFTERS, resolve_drafter
from carryover_hf.targets import TARGET_ALIASES

# Every drafter committed under drafters/ is checked here; its name says what it must be:
# smollm2-135m-<baseline|continued|carryover|campaign>-<dflash|markov>, and only "carryover" ones were trained with
# the draft-verify-draft objective ("campaign": a milestone of the training campaign, docs/training.md).
SHIPPED = sorted(f"{p.parent.name}/{p.name}" for p in SHIPPED_DRAFTERS.glob("*/*") if p.is_dir())
REQUIRED = [f"carryover-hf/smollm2-135m-{role}-dflash" for role in ("baseline", "continued", "carryover")]
# The proposal defaults the release scripts publish every drafter with (one file, sourced by both scripts).
DEFAULTS_FILE = Path(__file__).parents[1] / "examples" / "smollm2_135m" / "proposal_defaults.sh"
PROPOSAL_DEFAULTS = dict(re.findall(r"^SMOLLM2_(\w+)=(\w+)$", DEFAULTS_FILE.read_text(), re.M))


def naming(repo_id: str) -> tuple[bool, str]:
    """(trained with carryover, drafter kind) that the repo's name promises."""
    role, kind = repo_id.rsplit("/", 1)[1].removeprefix("smollm2-135m-").split("-")
    assert role in ("baseline", "continued", "carryover", "campaign") and kind in ("dflash", "markov"), repo_id
    return role == "carryover", kind


def test_the_dflash_trio_is_shipped_and_the_demo_default_is_a_carryover_drafter():
    assert set(REQUIRED) <= set(SHIPPED)
    assert DEFAULT_DRAFTER in SHIPPED and naming(DEFAULT_DRAFTER)[0]


@pytest.mark.parametrize("repo_id", sorted(SHIPPED))
def test_shipped_drafter_loads_by_repo_id_offline(repo_id, tmp_path, monkeypatch):
    with_carryover, kind = naming(repo_id)
    folder = SHIPPED_DRAFTERS / repo_id
    files = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == files
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "carryover_drafter"
    assert config["target_name_or_path"] == TARGET_ALIASES["smollm2-135m"]
    assert config["drafter_type"] == kind
    assert config["trained_with_carryover"] is with_carryover
    assert not set(OPTIONS) & set(config)  # the proposal defaults live in generation_config.json
    defaults = json.loads((folder / "generation_config.json").read_text())
    assert defaults["use_carryover"] is with_carryover  # DFlash-trained drafters draft as plain DFlash by default
    # A plain generate(assistant_model=drafter) runs the cost-aware round policy (0.3); round_policy="rules" runs the
    # setting the 0.2 benchmark measured fastest at T = 0 (carry_on+backoff8+lookup10 in
    # benchmarks/results/smollm2-135m-0.2-t0/). The card says both.
    policy, lookup, backoff = (PROPOSAL_DEFAULTS[k] for k in ("ROUND_POLICY", "LOOKUP_DRAFTS", "PROPOSAL_BACKOFF"))
    assert (policy, lookup, backoff) == ("cost", "10", "8"), "the shipped defaults changed: re-benchmark, then update"
    assert (defaults["round_policy"], defaults["lookup_drafts"], defaults["proposal_backoff"]) == ("cost", 10, 8)
    assert (folder / "model.safetensors").stat().st_size < 20 * 2**20  # bf16, small enough to commit

    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert f'AutoModel.from_pretrained("{repo_id}"' in card.text
    rules = f"context lookup of {lookup} tokens in front of the drafter; proposal backoff {backoff}"
    assert f'| Proposal defaults | {COST_POLICY_LABEL}; with `round_policy="rules"`: {rules}' in card.text

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    source, options = resolve_drafter(repo_id)
    drafter = AutoModel.from_pretrained(source, **options)
    assert isinstance(drafter, CarryoverDrafterModel) and drafter.dtype == torch.bfloat16
    assert drafter.config.trained_with_carryover is with_carryover
    # Trained, not freshly initialised: E_carry moved away from zero exactly when the carryover objective ran.
    assert bool(drafter.carry_embedding.abs().sum() > 0) is with_carryover
    assert {k: getattr(drafter.generation_config, k) for k in OPTIONS} == {k: defaults.get(k, v) for k, v in OPTIONS.items()}
    assert not any(hasattr(drafter.config, k) for k in OPTIONS)
