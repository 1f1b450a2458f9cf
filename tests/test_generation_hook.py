"""The generate hook is scoped: other assistants and modes get Transformers' own path with their arguments
untouched; per-call options reach the Carryover generator without changing the drafter; statistics and timing."""

import inspect

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin

import carryover_hf  # noqa: F401
from carryover_hf import generation
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def models():
    target = skew_towards_token(tiny_target("llama", vocab_size=16, seed=81), 3, 0.1)
    return target, tiny_drafter(target, block_size=4, seed=82)


def test_wrappers_keep_transformers_signatures():
    for name in ("_get_candidate_generator", "_validate_generation_mode"):
        wrapper = getattr(GenerationMixin, name)
        original = getattr(generation, f"_transformers{name}")
        assert wrapper.__wrapped__ is original
        assert inspect.signature(wrapper) == inspect.signature(original)


def test_other_candidate_generators_get_the_call_untouched(models):
    target, _ = models
    config = GenerationConfig(prompt_lookup_num_tokens=3, max_length=20)
    config._eos_token_tensor = None  # what generate's special-token preparation sets
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    # Positional arguments, as a caller other than Transformers might pass them.
    candidate = target._get_candidate_generator(config, prompt, prompt, LogitsProcessorList(), {})
    assert isinstance(candidate, PromptLookupCandidateGenerator) and candidate.num_output_tokens == 3
    output = target.generate(prompt, max_new_tokens=8, do_sample=False, prompt_lookup_num_tokens=3)
    assert torch.equal(output, target.generate(prompt, max_new_tokens=8, do_sample=False))


def test_per_call_options_leave_the_drafter_alone(models):
    target, drafter = models
    prompt = torch.tensor([[5, 6, 7, 8]])
    reference = target.generate(prompt, max_new_tokens=20, do_sample=False)
    assert drafter.generation_config.use_carryover and drafter.generation_config.draft_confidence_threshold is None
    runs = {}
    for options in (dict(), dict(use_carryover=False), dict(draft_confidence_threshold=0.3)):
        config = GenerationConfig(max_new_tokens=20, do_sample=False, **options)
        assert torch.equal(target.generate(prompt, assistant_model=drafter, generation_config=config), reference)
        runs[tuple(options)] = drafter.last_generation_stats
    assert max(runs[()].carry_rows) > 0 and set(runs[("use_carryover",)].carry_rows) == {0}
    assert runs[()].stopped_by_confidence == 0 and runs[("draft_confidence_threshold",)].stopped_by_confidence > 0
    assert drafter.generation_config.use_carryover and drafter.generation_config.draft_confidence_threshold is None  # never changed


def test_statistics_belong_to_the_generator_and_times_only_when_asked(models, monkeypatch):
    target, drafter = models
    prompt = torch.tensor([[5, 6, 7, 8]])
    generators = []

    class Recording(generation.RoundObserver):
        def generation_started(self, generator):
            generators.append(generator)

    monkeypatch.setattr(drafter, "round_observer", Recording(), raising=False)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    untimed = drafter.last_generation_stats
    assert untimed is generators[-1].stats and not untimed.timed
    assert untimed.prefill_time == untimed.drafting_time == untimed.verification_time == 0.0
    assert untimed.acceptance_lengths and len(untimed.acceptance_lengths) == len(untimed.draft_lengths)
    timed_config = GenerationConfig(max_new_tokens=12, do_sample=False, carryover_timing=True)
    target.generate(prompt, assistant_model=drafter, generation_config=timed_config)
    timed = drafter.last_generation_stats
    assert timed is generators[-1].stats and timed is not untimed and timed.timed
    assert timed.prefill_time > 0 and timed.drafting_time > 0 and timed.verification_time > 0


def test_declared_options_work_as_generate_keywords():
    target = tiny_target("llama", vocab_size=16, seed=83)
    drafter = tiny_drafter(target, block_size=4, seed=84)
    prompt = torch.tensor([[1, 5, 2]])
    with pytest.raises(ValueError, match="not used by the model.*use_carryover"):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=8, use_carryover=False)
    generation.declare_generation_options(target)
    output = target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False, use_carryover=False)
    assert set(drafter.last_generation_stats.carry_rows) == {0}
    assert torch.equal(output, target.generate(prompt, max_new_tokens=8, do_sample=False))  # plain modes unaffected


def test_proposal_defaults_live_in_the_drafters_generation_config(tmp_path):
    """Saved as generation_config.json beside the model and loaded with it; a call's own option wins; a checkpoint
    whose config.json still holds them (saved before) loads them into the generation config, without warnings."""
    import json
    import warnings

    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    from carryover_hf import CarryoverDrafterModel

    target = tiny_target("llama", vocab_size=16, seed=83)
    drafter = tiny_drafter(target, block_size=4, seed=84)
    drafter.generation_config.lookup_drafts = 3
    drafter.save_pretrained(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "generation_config.json").read_text())["lookup_drafts"] == 3
    assert "lookup_drafts" not in json.loads((tmp_path / "new" / "config.json").read_text())
    loaded = CarryoverDrafterModel.from_pretrained(tmp_path / "new")
    assert loaded.generation_config.lookup_drafts == 3 and loaded.generation_config.use_carryover is True
    prompt = torch.tensor([[1, 5, 2, 1, 5, 2]])
    target.generate(prompt, assistant_model=loaded, max_new_tokens=8, do_sample=False)
    assert loaded.last_generation_stats.lookup_proposals > 0
    config = GenerationConfig(max_new_tokens=8, do_sample=False, lookup_drafts=0)
    target.generate(prompt, assistant_model=loaded, generation_config=config)
    assert loaded.last_generation_stats.lookup_proposals == 0  # the call's own option wins

    old = json.loads((tmp_path / "new" / "config.json").read_text())
    old.update(lookup_drafts=5, use_carryover=False, proposal_backoff=None)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(old))
    (tmp_path / "old" / "model.safetensors").write_bytes((tmp_path / "new" / "model.safetensors").read_bytes())
    with warnings.catch_warnings(record=True) as caught, CaptureLogger(hf_logging.get_logger("transformers")) as log:
        warnings.simplefilter("always")
        loaded = CarryoverDrafterModel.from_pretrained(tmp_path / "old")
    assert not caught and "lookup_drafts" not in log.out and "use_carryover" not in log.out
    assert loaded.generation_config.lookup_drafts == 5 and loaded.generation_config.use_carryover is False
    assert not hasattr(loaded.config, "lookup_drafts")
    target.generate(prompt, assistant_model=loaded, max_new_tokens=8, do_sample=False)
    assert set(loaded.last_generation_stats.carry_rows) <= {0}
