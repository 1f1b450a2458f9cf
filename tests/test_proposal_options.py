"""Proposal options live in the drafter's generation_config: on its config they are refused, never silently ignored.

`drafter.config.use_carryover = False` used to set an attribute nothing reads (generate reads
`drafter.generation_config`). Now reading or setting any option of `generation.CARRYOVER_GENERATION_OPTIONS` on a
`CarryoverDrafterConfig` raises a one-line `ProposalOptionError` that names where it lives, while configs that carry
them at construction (old config.json files, constructor keywords) still move them into the generation config.
"""

from __future__ import annotations

import json

import pytest
from huggingface_hub.errors import StrictDataclassFieldValidationError

from carryover_hf import CarryoverDrafterModel
from carryover_hf.configuration_carryover import CALL_ONLY_OPTIONS, PROPOSAL_DEFAULTS, CarryoverDrafterConfig
from carryover_hf.errors import ProposalOptionError, UsageError
from carryover_hf.generation import CARRYOVER_GENERATION_OPTIONS
from carryover_hf.tools.testing import tiny_drafter, tiny_target

VALUES = {"use_carryover": False, "round_policy": "rules", "draft_confidence_threshold": 0.4, "proposal_backoff": 8,
          "lookup_drafts": 10, "lookup_backoff": 4, "carryover_timing": True, "verification_cost": "flat",
          "suffix_match": False}  # fmt: skip


@pytest.fixture(scope="module")
def drafter():
    return tiny_drafter(tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4))


def test_every_generate_option_is_a_drafter_default_or_a_call_option():
    assert set(CARRYOVER_GENERATION_OPTIONS) == set(PROPOSAL_DEFAULTS) | set(CALL_ONLY_OPTIONS) == set(VALUES)


@pytest.mark.parametrize("name", sorted(PROPOSAL_DEFAULTS))
def test_setting_a_proposal_default_on_the_config_names_the_generation_config(drafter, name):
    with pytest.raises(ProposalOptionError) as caught:
        setattr(drafter.config, name, VALUES[name])
    message = str(caught.value)
    assert "\n" not in message
    assert f"`drafter.generation_config.{name} = {VALUES[name]!r}`" in message
    assert isinstance(caught.value, UsageError) and isinstance(caught.value, AttributeError)
    with pytest.raises(ProposalOptionError, match=rf"drafter\.generation_config\.{name}"):
        drafter.config.update({name: VALUES[name]})  # Transformers' bulk setter goes the same way
    with pytest.raises(ProposalOptionError, match=rf"read `drafter\.generation_config\.{name}`"):
        getattr(drafter.config, name)
    assert not hasattr(drafter.config, name) and getattr(drafter.config, name, "unset") == "unset"
    assert name not in drafter.config.to_dict()


@pytest.mark.parametrize("name", CALL_ONLY_OPTIONS)
def test_setting_a_per_call_option_on_the_config_says_to_pass_it_to_generate(drafter, name):
    with pytest.raises(ProposalOptionError, match=rf"per-call option; pass `{name}=.*` to the generate call"):
        setattr(drafter.config, name, VALUES[name])


def test_other_fields_are_still_set_and_type_checked(drafter):
    config = CarryoverDrafterConfig.from_dict(drafter.config.to_dict())
    config.block_size = 8
    assert config.block_size == 8 and config.to_dict()["block_size"] == 8
    config.draft_vocab_size = None
    for name, value in (("block_size", "eight"), ("draft_vocab_size", 1.5), ("target_layer_ids", [1, "x"])):
        with pytest.raises(StrictDataclassFieldValidationError, match=f"Field .{name}. expected"):  # refused
            setattr(config, name, value)
    assert config.block_size == 8
    with pytest.raises(AttributeError, match="no attribute 'not_a_field'"):
        config.not_a_field  # noqa: B018


def test_old_config_files_and_constructor_keywords_still_set_the_generation_config(drafter, tmp_path):
    legacy = {"use_carryover": False, "lookup_drafts": 10, "proposal_backoff": 8}
    drafter.save_pretrained(tmp_path / "old")
    config_file = tmp_path / "old" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **legacy}))
    (tmp_path / "old" / "generation_config.json").unlink()  # saved before 0.3: config.json held the defaults
    loaded = CarryoverDrafterModel.from_pretrained(tmp_path / "old")
    assert {k: getattr(loaded.generation_config, k) for k in legacy} == legacy
    assert loaded.config.legacy_proposal_defaults == legacy and not hasattr(loaded.config, "use_carryover")

    config = CarryoverDrafterConfig(**{**drafter.config.to_dict(), "use_carryover": False})
    assert CarryoverDrafterModel(config).generation_config.use_carryover is False


def test_proposal_defaults_given_to_from_pretrained_replace_the_saved_ones(drafter, tmp_path):
    from transformers import AutoModel

    drafter.save_pretrained(tmp_path / "d")
    given = {"use_carryover": False, "lookup_drafts": 10, "round_policy": "cost"}
    for loader in (CarryoverDrafterModel, AutoModel):
        loaded = loader.from_pretrained(tmp_path / "d", **given)
        assert {k: getattr(loaded.generation_config, k) for k in given} == given
    assert CarryoverDrafterModel.from_pretrained(tmp_path / "d").generation_config.use_carryover is True  # unchanged
    for bad, message in (({"use_carryover": "no"}, "use_carryover must be True or False"),
                         ({"lookup_drafts": -1}, "lookup_drafts must be a whole number"),
                         ({"round_policy": "fast"}, "round_policy must be one of")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            CarryoverDrafterModel.from_pretrained(tmp_path / "missing", **bad)  # refused before looking for files
    with pytest.raises(ProposalOptionError, match="per-call option"):
        CarryoverDrafterModel.from_pretrained(tmp_path / "d", verification_cost="flat")
