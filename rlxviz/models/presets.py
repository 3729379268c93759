"""Named models that need no download, and the `Model` record every front end passes around.

`load_model(name, batch, seq, style, variant)` returns a `Model`: a graph, its weights and how
to make inputs for it. Presets register themselves with `@preset(name, description)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..ir import Graph
from .bert import BertConfig, Variant, build_bert, random_feeds, random_weights


@dataclass
class Model:
    """A graph with its weights.

    Attributes:
        name: preset name or checkpoint folder.
        graph: the unfused graph.
        weights: param name -> float32 array (`[in, out]` for linear weights).
        config: the model's config record (e.g. `BertConfig`), if any.
        description: one line for menus.
        tokenizer_file: a `tokenizer.json` usable with the `tokenizers` package, if the model has one.
        meta: anything else worth showing (checkpoint path, source package).
    """

    name: str
    graph: Graph
    weights: dict[str, np.ndarray]
    config: Any = None
    description: str = ""
    tokenizer_file: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def random_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs matching the graph: random token ids with some padding for BERT-like graphs,
        standard-normal float32 for any other input."""
        rng = np.random.default_rng(seed)
        feeds: dict[str, np.ndarray] = {}
        vocab = getattr(self.config, "vocab_size", 100)
        for n in self.graph.inputs:
            name = n.attrs["name"]
            if name in ("input_ids", "attention_mask") and n.rank == 2:
                bert = random_feeds(n.shape[0], n.shape[1], vocab, seed)
                feeds[name] = bert[name]
            elif n.dtype.is_float:
                feeds[name] = rng.standard_normal(n.shape).astype(n.dtype.numpy)
            else:
                feeds[name] = rng.integers(0, 2, size=n.shape).astype(n.dtype.numpy)
        return feeds


Factory = Callable[..., Model]
PRESETS: dict[str, tuple[Factory, str]] = {}


def preset(name: str, description: str) -> Callable[[Factory], Factory]:
    """Register `fn(batch, seq, style, variant) -> Model` under `name`."""

    def register(fn: Factory) -> Factory:
        PRESETS[name] = (fn, description)
        return fn

    return register


def _bert_preset(name: str, cfg: BertConfig, description: str) -> None:
    def make(batch: int = 1, seq: int = 128, style: str = "rlx", variant: Variant | None = None) -> Model:
        g = build_bert(cfg, batch, min(seq, cfg.max_position), style, variant, name=name.replace("-", "_"))
        return Model(name, g, random_weights(g, seed=0), cfg, description)

    preset(name, description)(make)


_bert_preset("bert-tiny", BertConfig(vocab_size=1000, hidden=64, heads=4, intermediate=256, layers=2, max_position=128),
             "2-layer tiny BERT (hidden 64), seeded random weights")
_bert_preset("minilm-shaped", BertConfig(), "6-layer MiniLM-L6-shaped BERT (hidden 384), seeded random weights")
_bert_preset("bert-base-shaped", BertConfig(hidden=768, heads=12, intermediate=3072, layers=12),
             "12-layer BERT-base-shaped encoder (hidden 768), seeded random weights")


def load_model(name: str, batch: int = 1, seq: int = 128, style: str | None = None,
               variant: Variant | None = None) -> Model:
    """Build the preset `name`; `style=None` uses the preset's own style (`rlx` for the random BERT
    presets, `hf` for the real `minilm` checkpoint). Raises KeyError listing the known presets."""
    if name not in PRESETS:
        raise KeyError(f"unknown model {name!r}; presets: {', '.join(sorted(PRESETS))}")
    kwargs = {} if style is None else {"style": style}
    return PRESETS[name][0](batch=batch, seq=seq, variant=variant, **kwargs)
