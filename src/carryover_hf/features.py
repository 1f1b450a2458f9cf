"""Target features: the outputs of the target layers a drafter reads, gathered the same way at training and inference."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .compatibility import HIDDEN_STATES_LIST_COUNTS_EMBEDDINGS


def hidden_state_indices(target_layer_ids: Sequence[int]) -> list[int]:
    """Indices into `outputs.hidden_states` of a forward called with `output_hidden_states=<these indices>`.

    Passed as `output_hidden_states=[...]`, Transformers records only these: on 5.23+ the output of decoder layer `i`
    is `hidden_states[i + 1]` (entry 0 is the embeddings), on 5.17-5.22 `hidden_states[i]`
    (`compatibility.HIDDEN_STATES_LIST_COUNTS_EMBEDDINGS`). The last layer's entry is the final-norm output, so a
    layer id of `L - 1` reads the normed state, at training and inference alike.
    """
    offset = int(HIDDEN_STATES_LIST_COUNTS_EMBEDDINGS)
    return [i + offset for i in target_layer_ids]


def gather_target_features(hidden_states: Sequence[torch.Tensor | None], target_layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate the selected layers' states: (b, n, H) each -> (b, n, k * H), from the hidden states of a forward
    called with `output_hidden_states=hidden_state_indices(...)` (on 5.23+ also `output_hidden_states=True`)."""
    selected = [hidden_states[i] for i in hidden_state_indices(target_layer_ids)]
    if any(state is None for state in selected):
        raise ValueError(
            "The target outputs lack hidden states of layers "
            f"{[i for i, s in zip(target_layer_ids, selected) if s is None]}; call it with "
            f"output_hidden_states={hidden_state_indices(target_layer_ids)}."
        )
    return torch.cat(selected, dim=-1)




def embed_block_tokens(embedding: torch.nn.Module, token_ids: torch.LongTensor) -> torch.Tensor:
    """Embeddings of block rows (anchor and mask tokens) through the target's input embedding.

    An `embed_norm` inside the embedding module (Muse Glimmer, Inkling) is bypassed, as Transformers' DFlash path
    does, so imported DFlash drafters see the inputs they were trained on. Training and inference both call this.
    """
    embed_norm = getattr(embedding, "embed_norm", None)
    if embed_norm is None:
        return embedding(token_ids)
    try:
        embedding.embed_norm = torch.nn.Identity()
        return embedding(token_ids)
    finally:
        embedding.embed_norm = embed_norm


__all__ = ["embed_block_tokens", "gather_target_features", "hidden_state_indices"]
