"""Bad input fails before any work starts, with a message that says what is wrong and how to fix it."""

import pytest
import torch
from transformers import GenerationMixin, LlamaConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

import carryover_hf  # noqa: F401
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel, DrafterTargetMismatchError
from carryover_hf.tools.testing import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=32, seed=0)


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self._count)

    def _count(self, *_):
        self.calls += 1


def _drafter_with(target, **overrides):
    config = CarryoverDrafterConfig.from_target_config(target.config, block_size=4)
    config_dict = config.to_dict()
    config_dict.update(overrides)
    return CarryoverDrafterModel(CarryoverDrafterConfig(**{k: v for k, v in config_dict.items() if k != "model_type"}))


def _generate(target, drafter, input_ids):
    counter = ForwardCounter(target)
    try:
        target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=drafter, max_new_tokens=5)
    finally:
        counter.handle.remove()
        assert counter.calls == 0, "the target ran before the error was raised"


def test_batch_larger_than_one(target):
    with pytest.raises(ValueError, match="batch of 2 sequences.*once per prompt"):
        _generate(target, tiny_drafter(target), torch.ones(2, 4, dtype=torch.long))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(target_hidden_size=128, hidden_size=128), "hidden size: drafter expects 128, target has 64"),
        (dict(target_num_hidden_layers=8), "layer count: drafter expects 8, target has 4"),
        (dict(vocab_size=40), "vocabulary: drafter expects 40, target has 32"),
    ],
)
def test_drafter_for_another_target(target, overrides, message):
    with pytest.raises(DrafterTargetMismatchError, match=message):
        _generate(target, _drafter_with(target, **overrides), torch.ones(1, 4, dtype=torch.long))


def test_layer_ids_out_of_range_for_this_target(target):
    # Valid for the 8-layer target it records, but this target has 4 layers.
    drafter = _drafter_with(target, target_num_hidden_layers=8, target_layer_ids=[1, 6])
    with pytest.raises(DrafterTargetMismatchError, match=r"target_layer_ids \[6\] do not exist"):
        _generate(target, drafter, torch.ones(1, 4, dtype=torch.long))


def test_layer_ids_out_of_range_in_config():
    with pytest.raises(Exception, match=r"target_layer_ids \[9\] are out of range"):
        CarryoverDrafterConfig(target_num_hidden_layers=4, target_layer_ids=[1, 9], num_hidden_layers=1)


def test_padded_attention_mask(target):
    drafter = tiny_drafter(target)
    with pytest.raises(ValueError, match="padded positions"):
        target.generate(torch.ones(1, 4, dtype=torch.long), attention_mask=torch.tensor([[0, 1, 1, 1]]), assistant_model=drafter, max_new_tokens=3)


class NoHiddenStatesLM(PreTrainedModel, GenerationMixin):
    """A causal LM that cannot return per-layer hidden states."""

    config_class = LlamaConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids=None, **kwargs):
        return CausalLMOutput(logits=self.head(self.embed(input_ids)))


def test_target_without_layer_hidden_states(target):
    config = LlamaConfig(**{**target.config.to_dict(), "attn_implementation": "eager"})
    model = NoHiddenStatesLM(config)
    with pytest.raises(ValueError, match="cannot return per-layer hidden states"):
        _generate(model, tiny_drafter(target), torch.ones(1, 4, dtype=torch.long))


def test_bad_drafter_type_and_block_size():
    with pytest.raises(Exception, match="drafter_type must be one of"):
        CarryoverDrafterConfig(drafter_type="eagle")
    with pytest.raises(Exception, match="block_size must be at least 2"):
        CarryoverDrafterConfig(block_size=1)


def test_fresh_drafter_starts_neutral():
    """A fresh E_carry is zero and a fresh Markov head adds nothing, so both start from the DFlash backbone."""
    target = tiny_target("llama", vocab_size=32, seed=0)
    config = CarryoverDrafterConfig.from_target_config(target.config, block_size=4, drafter_type="markov")
    drafter = CarryoverDrafterModel(config)
    assert torch.count_nonzero(drafter.carry_embedding) == 0
    assert torch.count_nonzero(drafter.markov_head.proj.weight) == 0
    assert drafter.fc.weight.std() > 0 and drafter.markov_head.token_embedding.weight.std() > 0


@pytest.mark.parametrize(
    "option",
    [dict(prompt_lookup_num_tokens=3), dict(speculation_type="dflash"), dict(assistant_early_exit=2), dict(use_mtp=True)],
)
def test_another_speculation_option_next_to_a_carryover_drafter(target, option):
    counter = ForwardCounter(target)
    try:
        with pytest.raises(ValueError, match="together with .*selects another candidate generator"):
            target.generate(torch.ones(1, 4, dtype=torch.long), assistant_model=tiny_drafter(target), max_new_tokens=3, **option)
    finally:
        counter.handle.remove()
    assert counter.calls == 0


def test_prefilled_target_cache_is_refused_before_any_work(target):
    """Transformers 5.23's assisted loop re-runs the whole prompt over a pre-filled cache (prompt lookup included),
    so the drafter refuses it with a clear message instead of failing mid-generation."""
    from transformers.cache_utils import DynamicCache

    prompt = torch.tensor([[1, 2, 3, 4, 5, 6]])
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(prompt[:, :4], past_key_values=cache)
    counter = ForwardCounter(target)
    try:
        with pytest.raises(ValueError, match="already holds 4 tokens.*without `past_key_values`"):
            target.generate(prompt, past_key_values=cache, assistant_model=tiny_drafter(target), max_new_tokens=4)
    finally:
        counter.handle.remove()
    assert counter.calls == 0 and cache.get_seq_length() == 4
    # The reason, upstream: Transformers' own prompt lookup with the same pre-filled cache departs from the target.
    reference = target.generate(prompt, max_new_tokens=6, do_sample=False)
    lookup = target.generate(prompt, past_key_values=cache, max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=2)
    assert not torch.equal(lookup, reference), "Transformers now handles pre-filled caches in assisted decoding: support it"
    # An empty cache is fine.
    output = target.generate(prompt, past_key_values=DynamicCache(config=target.config), assistant_model=tiny_drafter(target),
                             max_new_tokens=6, do_sample=False)
    assert torch.equal(output, reference)


def test_confidence_threshold_out_of_range(target):
    from transformers import GenerationConfig

    with pytest.raises(Exception, match=r"draft_confidence_threshold must lie in \[0, 1\]"):
        CarryoverDrafterConfig(draft_confidence_threshold=1.5)
    with pytest.raises(ValueError, match=r"draft_confidence_threshold must lie in \[0, 1\]"):
        target.generate(torch.ones(1, 4, dtype=torch.long), assistant_model=tiny_drafter(target),
                        generation_config=GenerationConfig(max_new_tokens=3, draft_confidence_threshold=-0.1))


@pytest.mark.parametrize("value", [-1, 1.5, True, "4"])
@pytest.mark.parametrize("name, unit", [("proposal_backoff", "rounds"), ("lookup_drafts", "tokens")])
def test_count_options_must_be_whole_numbers(target, name, unit, value):
    from transformers import GenerationConfig

    message = f"{name} must be a whole number of {unit}"
    with pytest.raises(Exception, match=message):
        CarryoverDrafterConfig(**{name: value})
    with pytest.raises(ValueError, match=message):
        target.generate(torch.ones(1, 4, dtype=torch.long), assistant_model=tiny_drafter(target),
                        generation_config=GenerationConfig(max_new_tokens=3, **{name: value}))


def test_unsupported_transformers_version_is_named_at_import(monkeypatch):
    from carryover_hf.compatibility import ALLOW_UNSUPPORTED_ENV, check_transformers_version

    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    for version in ("5.17.0", "5.20.1", "5.23.0", "5.24.0", "5.25.0"):
        check_transformers_version(version)
    for version in ("5.16.1", "5.26.0", "6.0.0"):
        with pytest.raises(ImportError, match=rf"supports Transformers >=5.17,<5.26, but {version} is installed.*pip install"):
            check_transformers_version(version)
    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    with pytest.warns(UserWarning, match="supports Transformers"):
        check_transformers_version("5.26.0")
