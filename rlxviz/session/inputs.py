"""Inputs for a model: its tokenizer on a text, seeded random inputs, or the user's arrays (`load_inputs`:
an `.npz` checked against the graph's inputs, `runtime.battery`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..models import Model, tokenize
from ..models.onnx.dims import DimError
from ..runtime.battery import (
    EXPECTED_PREFIX,
    InputSet,
    check_inputs,
    index_bounds,
    load_expected,
    load_inputs,
    npz_headers,
)
from .errors import CLI_DIMS, SessionError, UnboundDimsError

SHAPE_ARRAYS = (("input_ids", 2), ("hidden_states", 3))
"""The arrays whose shape gives a built graph's batch and sequence length (`shape_from_inputs`), with their rank:
token ids `[batch, seq]` (BERT-like models), hidden states `[batch, seq, hidden]` (decoder blocks)."""


def shape_from_inputs(headers: Mapping[str, tuple[tuple[int, ...], np.dtype]], name: str) -> tuple[int, int] | None:
    """`(batch, seq)` an inputs file sets, as `rlxviz time --inputs` and the app's Timing tab take them: the header
    shape (`npz_headers`) of `input_ids` or else `hidden_states`; None when the file holds neither.

    Args:
        headers: array name -> (shape, dtype), from `npz_headers`.
        name: the file's name, for the message.

    Raises:
        ValueError: `input_ids` / `hidden_states` of another rank, or with an empty dimension (one line).
    """
    for key, rank in SHAPE_ARRAYS:
        if key in headers:
            shape = headers[key][0]
            if len(shape) != rank or 0 in shape:
                raise ValueError(f"{name}: {key} must be a non-empty rank-{rank} array, got shape {list(shape)}")
            return int(shape[0]), int(shape[1])
    return None


TEXT_SET = ("text", "the text box tokenized (Text to tokenize)")
"""The name and line of the input set `feeds` makes from a text (`feeds_kind`): not random inputs."""

RANDOM_SET = ("random", "seeded random inputs")
"""The name and line of the input set `feeds` makes when it does not tokenize (`runtime.battery`'s `random`)."""


INPUTS_BESIDE = ("{stem}_io.npz", "{stem}.npz")
"""Names of a model's inputs file beside its `.onnx` file, in the order looked for: the exporters' `NAME_io.npz`
(inputs and `out:NAME` reference outputs), then `NAME.npz`."""


def inputs_beside(model_file: Path, input_name: str) -> Path | None:
    """The `.npz` beside `model_file` (`INPUTS_BESIDE`) that holds an array named `input_name`, read from the npz's
    headers alone (`npz_headers`: no array data); None when there is none, or it is unreadable. Raises nothing."""
    for pattern in INPUTS_BESIDE:
        path = model_file.with_name(pattern.format(stem=model_file.stem))
        try:
            if path.is_file() and input_name in npz_headers(path):
                return path
        except (OSError, ValueError):
            continue
    return None


def unbound_dims(model: str, model_file: Path, e: DimError) -> SessionError:
    """`e` as the session says it: the dims nothing binds and how to bind them, value first (`UnboundDimsError.said_as`
    in `CLI_DIMS`), with the inputs file beside the model that holds the first unbound input's array
    (`inputs_beside`) and the values its array shapes give each name (read from the npz's headers: `M: --dim
    num_channels=3 --dim height=32 --dim width=32 (from the shapes in F.npz beside the file), or --inputs F.npz;
    input 'pixel_values': ...`). An `UnboundDimsError` when `e` names dims (its parts for a front end's own words:
    the app's Input dims box), else a plain SessionError. Raises nothing."""
    beside = inputs_beside(model_file, e.input) if e.input else None
    said = next(iter(str(e).splitlines()), "")
    if not e.names:
        hint = f"; {beside.name} beside the file holds {e.input!r}: --inputs {beside}" if beside else ""
        return SessionError(f"{model}: {said}{hint}")
    proposed: dict[str, int] = {}
    if beside is not None:
        shapes = {k: v[0] for k, v in npz_headers(beside).items()}
        for name in e.names:
            inp, axis = e.where.get(name, ("", -1))
            if inp in shapes and 0 <= axis < len(shapes[inp]) and shapes[inp][axis] > 0:
                proposed[name] = int(shapes[inp][axis])
    parts = {"model": model, "what": e.what, "names": e.names, "input": e.input, "proposed": proposed, "said": said,
             "beside": beside.name if beside else "", "path": str(beside) if beside else ""}
    return UnboundDimsError(UnboundDimsError("", **parts).said_as(CLI_DIMS), **parts)


def feeds_kind(model: Model, text: str = "") -> tuple[str, str]:
    """What `feeds(model, text)` is, as the input set's name and line the Timing tab lists (`timing.input_sets`'
    `base`): `TEXT_SET` when it tokenizes `text` (a tokenizer, `input_ids` and `attention_mask` inputs, a text that
    is not blank), else `RANDOM_SET`."""
    return TEXT_SET if _tokenized_shape(model, text) is not None else RANDOM_SET


def _tokenized_shape(model: Model, text: str) -> tuple[int, int] | None:
    """`(batch, seq)` of the token ids `feeds` makes from `text`, or None when it makes random inputs instead."""
    if model.tokenizer_file is None or not text.strip():
        return None
    ids = {n.attrs["name"]: n for n in model.graph.inputs}
    if not set(ids) >= {"input_ids", "attention_mask"}:
        return None
    b, s = ids["input_ids"].shape
    return int(b), int(s)


def feeds(model: Model, text: str = "") -> dict[str, np.ndarray]:
    """Inputs for `model`: `text` tokenized (one copy per batch row, padded to the graph's sequence length)
    when the model has a tokenizer and takes `input_ids` + `attention_mask`, else `Model.random_feeds(seed=0)`
    (`feeds_kind` names which).

    Returns:
        Input name -> array of the graph input's shape and dtype (token ids and mask: int64 `[batch, seq]`).
    """
    shape = _tokenized_shape(model, text)
    if shape is not None:
        return tokenize([text] * shape[0], shape[1], model.tokenizer_file)
    return model.random_feeds(seed=0)


__all__ = ["EXPECTED_PREFIX", "SHAPE_ARRAYS", "InputSet", "RANDOM_SET", "TEXT_SET", "check_inputs", "feeds",
           "feeds_kind", "index_bounds", "load_expected", "load_inputs", "npz_headers", "shape_from_inputs"]
