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

from ..ir import DType, Graph, Op
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
        bounds = index_bounds(self.graph)
        for n in self.graph.inputs:
            name = n.attrs["name"]
            # ids stay inside every table they index (the config's vocabulary and the graph's gathers)
            vocab = max(1, min(getattr(self.config, "vocab_size", None) or 100, bounds.get(n.id, 1 << 62)))
            if name in ("input_ids", "attention_mask") and n.rank == 2 and n.dtype.is_int:
                bert = random_feeds(n.shape[0], n.shape[1], vocab, seed)
                feeds[name] = bert[name].astype(n.dtype.numpy, copy=False)
            elif n.dtype.is_float:
                feeds[name] = rng.standard_normal(n.shape).astype(n.dtype.numpy)
            else:
                hi = min(2, bounds.get(n.id, 2)) if n.dtype != DType.bool else 2
                feeds[name] = rng.integers(0, max(hi, 1), size=n.shape).astype(n.dtype.numpy)
        return feeds


_INDEX_PASSTHROUGH = frozenset({Op.CAST, Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.EXPAND, Op.CONCAT})


def index_bounds(graph: Graph) -> dict[int, int]:
    """For each input that (through casts and data movement) indexes a `gather`, the size of the smallest
    table axis it indexes: ids drawn in `0..bound-1` are valid for every gather. Inputs that index
    nothing are absent."""
    bounds: dict[int, int] = {}
    for n in graph.inputs:
        seen, todo, best = {n.id}, [n.id], None
        while todo:
            for u in graph.users(todo.pop()):
                if u.op == Op.GATHER and len(u.inputs) == 2 and u.inputs[1] in seen:
                    table = graph[u.inputs[0]]
                    axis = int(u.attrs.get("axis", 0)) % max(table.rank, 1)
                    if table.rank:
                        size = table.shape[axis]
                        best = size if best is None else min(best, size)
                elif u.op in _INDEX_PASSTHROUGH and u.id not in seen:
                    seen.add(u.id)
                    todo.append(u.id)
        if best is not None:
            bounds[n.id] = best
    return bounds


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
        if not 0 < seq <= cfg.max_position:  # never shrink silently: the header and the graph must agree
            raise ValueError(f"seq {seq} must be in 1..{cfg.max_position} ({name}'s max_position_embeddings)")
        g = build_bert(cfg, batch, seq, style, variant, name=name.replace("-", "_"))
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
