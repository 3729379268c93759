"""Inputs for a model: its tokenizer on a text, or seeded random inputs."""

from __future__ import annotations

import numpy as np

from ..models import Model, tokenize


def feeds(model: Model, text: str = "") -> dict[str, np.ndarray]:
    """Inputs for `model`: `text` tokenized (one copy per batch row, padded to the graph's sequence length)
    when the model has a tokenizer and takes `input_ids` + `attention_mask`, else `Model.random_feeds(seed=0)`.

    Returns:
        Input name -> array of the graph input's shape and dtype (token ids and mask: int64 `[batch, seq]`).
    """
    if model.tokenizer_file is not None and text.strip():
        ids = {n.attrs["name"]: n for n in model.graph.inputs}
        if set(ids) >= {"input_ids", "attention_mask"}:
            b, s = ids["input_ids"].shape
            return tokenize([text] * b, s, model.tokenizer_file)
    return model.random_feeds(seed=0)


__all__ = ["feeds"]
