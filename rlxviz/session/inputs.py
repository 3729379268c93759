"""Inputs for a model: its tokenizer on a text, seeded random inputs, or the user's arrays (`load_inputs`:
an `.npz` checked against the graph's inputs, `runtime.battery`)."""

from __future__ import annotations

import numpy as np

from ..models import Model, tokenize
from ..runtime.battery import InputSet, check_inputs, index_bounds, load_expected, load_inputs, npz_headers


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


__all__ = ["InputSet", "check_inputs", "feeds", "index_bounds", "load_expected", "load_inputs", "npz_headers"]
