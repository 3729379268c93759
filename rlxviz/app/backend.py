"""The app's only door to the other parts of rlxviz (models, passes, viz, runtime), with caches.

Every function here calls a public function of another package. A package that has not landed
yet raises `NotAvailable`, which the state turns into a "not available yet" message instead of
failing. Results are cached per `(model key, shapes, pipeline)` across sessions.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import threading
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..ir import Graph, lint, parse_ir
from ..models import VARIANTS, Model, load_model
from ..models.bert import random_weights
from ..passes.pipeline import RLX_FAB_MAX_TOKENS
from .jobs import LRUCache
from .sources import check_graph_size
from .text import md_escape

MODELS = LRUCache(maxsize=4)
TRACES = LRUCache(maxsize=16)
RENDERS = LRUCache(maxsize=512)
TIMINGS = LRUCache(maxsize=32)


class NotAvailable(RuntimeError):
    """A part of rlxviz the app needs has not been installed or built yet."""


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise NotAvailable(f"{what} ({name}) is not available yet: {e}") from None


def _attr(module: str, attr: str, what: str) -> Any:
    mod = _module(module, what)
    if not hasattr(mod, attr):
        raise NotAvailable(f"{what} ({module}.{attr}) is not available yet")
    return getattr(mod, attr)


# -- models ---------------------------------------------------------------------------------------

def presets() -> dict[str, str]:
    """Preset name -> one-line description (the real MiniLM first when installed)."""
    from ..models import PRESETS

    names = sorted(PRESETS, key=lambda n: (n != "minilm", n))
    return {n: PRESETS[n][1] for n in names}


def default_preset() -> str:
    """`minilm` when its package is installed, else the first preset."""
    p = presets()
    if "minilm" in p:
        try:
            _attr("rlxviz.models.minilm", "minilm_dir", "the MiniLM preset")()
            return "minilm"
        except Exception:  # noqa: BLE001 - not installed: fall back to a random-weight preset
            pass
    return next((n for n in p if n != "minilm"), next(iter(p)))


def variant_for(name: str, layer: int) -> Any:
    """The `Variant` record for a teaching-variant name (None for `none` and for shape-only variants)."""
    v = VARIANTS.get(name)
    if v is None or name == "none":
        return None
    return replace(v, layer=layer)


def load_preset(name: str, batch: int, seq: int, style: str | None, variant: str, layer: int) -> Model:
    """A preset model, cached per (name, shapes, style, variant)."""
    key = ("preset", name, batch, seq, style, variant, layer)
    kwargs: dict[str, Any] = {"variant": variant_for(variant, layer)}
    if style:
        kwargs["style"] = style
    return MODELS.get_or_compute(key, lambda: load_model(name, batch, seq, **kwargs))


def load_folder(folder: Path, batch: int, seq: int, style: str | None, variant: str, layer: int,
                allowed: list[Path] | None, key: str) -> Model:
    """A Hugging Face checkpoint folder (`rlxviz.models.checkpoint.load_checkpoint`), cached under `key`."""
    load_checkpoint = _attr("rlxviz.models.checkpoint", "load_checkpoint", "the checkpoint loader")
    kwargs: dict[str, Any] = {"variant": variant_for(variant, layer)}
    if style:
        kwargs["style"] = style
    return MODELS.get_or_compute(("folder", key, batch, seq, style, variant, layer),
                                 lambda: load_checkpoint(folder, batch, seq, allowed, **kwargs))


def load_ir(text: str) -> Model:
    """A model from IR text: the parsed, linted graph with seeded random weights for its params.

    Raises:
        IRSyntaxError: malformed text (line, column, caret). GraphError: a graph that parses but is invalid.
        SourceError: the graph declares more input + param bytes than `RLXVIZ_MAX_TENSOR_MB` allows.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()

    def build() -> Model:
        g = lint(parse_ir(text), "parse")
        check_graph_size(g)  # before the weights are allocated
        return Model(g.name, g, random_weights(g, seed=0), None, "graph from IR text")

    return MODELS.get_or_compute(("ir", digest), build)


def feeds(model: Model, batch: int, seq: int, text: str) -> dict[str, np.ndarray]:
    """Inputs for `model`: `text` tokenized (one copy per batch row) when the model has a tokenizer,
    else seeded random inputs (`Model.random_feeds`)."""
    if model.tokenizer_file is not None and text.strip():
        ids = {n.attrs["name"]: n for n in model.graph.inputs}
        if set(ids) >= {"input_ids", "attention_mask"}:
            tokenize = _attr("rlxviz.models.minilm", "tokenize", "the tokenizer")
            b, s = ids["input_ids"].shape
            return tokenize([text] * b, s, model.tokenizer_file)
    return model.random_feeds(seed=0)


def graph_digest(graph: Graph) -> str:
    """A content hash of a graph (its IR text), for cache keys."""
    from ..ir import format_graph

    return hashlib.sha256(format_graph(graph).encode()).hexdigest()[:16]


# -- passes -----------------------------------------------------------------------------------------

FULL_VIEW_LIMIT = 400
"""`auto` view: graphs with more nodes than this are drawn one box per layer."""


def _passes() -> Any:
    mod = _module("rlxviz.passes", "the fusion passes")
    if not hasattr(mod, "Pipeline"):
        raise NotAvailable("the fusion passes (rlxviz.passes.Pipeline) are not available yet")
    return mod


def canonical_passes() -> list[str]:
    """Pass names in the canonical order (`rlxviz.passes.CANONICAL_ORDER`)."""
    return list(_passes().CANONICAL_ORDER)


def available_passes() -> list[str]:
    """Every pass a user may add (`rlxviz.passes.PASSES`)."""
    return list(_passes().PASSES)


def default_threshold() -> int | None:
    """The canonical pipeline's attention gate on batch*seq (`fab_max_tokens`; None = no gate)."""
    return _passes().DEFAULT_PARAMS.get("fab_max_tokens")


RLX_THRESHOLD = RLX_FAB_MAX_TOKENS
"""RLX's batch*seq gate (`RLX_FUSE_ATTN_THRESHOLD` default), used by the over-threshold variant when no
threshold is set."""


_TRACE_KEYS: dict[int, tuple[weakref.ref, tuple]] = {}
_TRACE_LOCK = threading.Lock()
_UNIQUE = itertools.count()


def _remember(trace: Any, key: tuple) -> None:
    tid = id(trace)

    def forget(ref: weakref.ref) -> None:
        with _TRACE_LOCK:
            if _TRACE_KEYS.get(tid, (None,))[0] is ref:
                del _TRACE_KEYS[tid]

    with _TRACE_LOCK:
        hit = _TRACE_KEYS.get(tid)
        if hit is None or hit[0]() is not trace:
            _TRACE_KEYS[tid] = (weakref.ref(trace, forget), key)


def trace_key(trace: Any) -> tuple:
    """The content key of a `Trace`: `("trace", input graph digest, passes, threshold)` for traces made by
    `run_pipeline`, a key of its own for any other trace object (never shared with another trace)."""
    with _TRACE_LOCK:
        hit = _TRACE_KEYS.get(id(trace))
        if hit is not None and hit[0]() is trace:
            return hit[1]
    key = ("trace-object", next(_UNIQUE))
    _remember(trace, key)
    return trace_key(trace)


def run_pipeline(model: Model, passes: list[str], threshold: int | None) -> Any:
    """The pipeline's `Trace` on `model.graph`, cached per (graph, passes, threshold).

    Args:
        passes: enabled pass names in run order (duplicates allowed).
        threshold: `fab_max_tokens`, the batch*seq gate of attention fusion (None: no gate).
    """
    mod = _passes()
    key = ("trace", graph_digest(model.graph), tuple(passes), threshold)
    trace = TRACES.get_or_compute(key, lambda: mod.Pipeline(list(passes), {"fab_max_tokens": threshold},
                                                            "app").run(model.graph))
    _remember(trace, key)
    return trace


def explain_layer(trace: Any, layer: int) -> Any:
    """`rlxviz.passes.explain(trace, layer)`: each rule's outcome for the layer and the sibling comparison."""
    return _attr("rlxviz.passes", "explain", "the fusion explanations")(trace, layer)


_OK = "<b style='color:#2e7d32'>fused</b> ·"
_NO = "<b style='color:#c62828'>rejected</b> ·"
_NA = "<b style='color:#757575'>skipped</b> ·"


def why_markdown(e: Any) -> str:
    """A `LayerExplanation` in plain words (Markdown): verdict, first failing guard, outcomes, sibling diff."""
    fused = [o for o in e.outcomes if o.status == "fused"]
    rejected = [o for o in e.outcomes if o.status == "rejected"]
    whole = any(o.pass_name == "fuse_transformer_layer" for o in fused)
    lines = [f"### Layer {e.layer}"]
    if whole:
        lines.append(f"**Layer {e.layer} fused** into one FusedTransformerLayer.")
    elif rejected:
        r = rejected[0]
        lines.append(f"**Layer {e.layer} did not fully fuse.** The first guard that said no is "
                     f"**`{r.guard}`** in `{r.rule}`:")
        lines.append(f"> {md_escape(r.message)}")
        if r.hint:
            lines.append(f"**What to do:** {md_escape(r.hint)}")
    else:
        lines.append(f"No pattern of the pipeline rejected layer {e.layer}, and no layer-level fusion ran on it "
                     "(is `fuse_transformer_layer` enabled?).")
    lines.append("#### Each pattern's outcome")
    for o in e.outcomes:
        if o.status == "fused":
            lines.append(f"- {_OK} `{o.rule}` (node{'s' if len(o.nodes) > 1 else ''} "
                         f"{', '.join(f'%{n}' for n in o.nodes)})")
        elif o.status == "rejected":
            lines.append(f"- {_NO} `{o.rule}` at **{md_escape(o.guard)}** ({o.stage}): {md_escape(o.message)}")
    skipped = [o.rule for o in e.outcomes if o.status == "not applicable"]
    if skipped:
        lines.append(f"- {_NA} not applicable here: {', '.join(f'`{r}`' for r in skipped)}")
    if e.sibling is not None:
        lines.append(f"#### What differs from layer {e.sibling}, where `{e.sibling_rule}` fused")
        diff = "\n".join(e.differences) if e.differences else "(same primitive structure)"
        lines.append(f"```\n{diff}\n```")
    return "\n\n".join(lines)


# -- viz --------------------------------------------------------------------------------------------

def _viz() -> Any:
    mod = _module("rlxviz.viz", "the renderer")
    if not hasattr(mod, "render_dot"):
        raise NotAvailable("the renderer (rlxviz.viz.render_dot) is not available yet")
    return mod


class Picture:
    """A frozen view of what one drawing shows, taken from the state once (the trace, version, layer), so the
    cache key and the drawing always describe the same graph even when the state moves on meanwhile.

    Attributes:
        key: cache key of the drawing: the trace's content key (`trace_key`), the version index into
            `trace.versions()`, the view, the side and the focused layer.
    """

    def __init__(self, state: Any, k: int | None, view: str, side: str = "after") -> None:
        self.trace = state.trace
        self.graph0 = state.model.graph if self.trace is None and state.model is not None else None
        self.i = state.version_index(k, self.trace) if self.trace is not None else 0
        self.view, self.side = view, side
        self.layer = state.selected_layer if view == "focus" or side == "why" else None
        if self.trace is not None:
            src = trace_key(self.trace)
        elif self.graph0 is not None:
            src = ("graph", graph_digest(self.graph0))
        else:
            raise ValueError("no model loaded yet")
        self.key = ("svg", side, src, self.i, view, self.layer)

    def parts(self) -> tuple[Graph, Any, dict[str, Any]]:
        """(graph, overlay, render_dot keyword arguments) of this picture."""
        viz = _viz()
        trace, view = self.trace, self.view
        if trace is None:
            g, ov = self.graph0, None
        else:
            step = trace.steps[self.i - 1] if self.i > 0 else None
            if self.side == "why":
                g, ov = _why_picture(viz, trace, self.layer, step)
            elif step is None:
                g, ov = trace.input, None
            elif self.side == "before":
                g, ov = step.before, viz.Overlay.before(step)
            else:
                g, ov = step.after, viz.Overlay.after(step)
        kw: dict[str, Any] = {"view": "layers" if view == "collapsed" else "full"}
        if view == "focus":
            if self.layer is None:
                raise ValueError("pick a layer to focus on")
            kw["focus"] = self.layer
        if view == "collapsed" and trace is not None and ov is None:
            ov = viz.Overlay.trace_summary(trace)
        return g, ov, kw

    def dot(self) -> str:
        g, ov, kw = self.parts()
        return _viz().render_dot(g, ov, **kw)


def picture(state: Any, k: int | None, view: str, side: str = "after") -> tuple[Graph, Any, dict[str, Any]]:
    """What to draw for shown version `k`: (graph, overlay, render_dot keyword arguments).

    `side="after"` is the version itself with its pass's fused nodes marked; `side="before"` is the graph
    before that pass with every match clustered and every rejection marked; `side="why"` is the graph before
    the pass that first rejected something in the selected layer. `view` is `full`, `collapsed` (one box per
    layer) or `focus` (the selected layer of the full view).
    """
    return Picture(state, k, view, side).parts()


def _why_picture(viz: Any, trace: Any, layer: int | None, step: Any) -> tuple[Graph, Any]:
    """The graph before the pass whose rejection `explain` reports first for `layer`, with that pass's overlay
    (else the selected version with its own overlay)."""
    try:
        rejected = explain_layer(trace, layer).rejected if layer is not None else []
    except NotAvailable:
        rejected = []
    if rejected:
        s = trace.step(rejected[0].pass_name)
        return s.before, viz.Overlay.before(s)
    return (step.after, viz.Overlay.after(step)) if step is not None else (trace.input, None)


def render_dot(state: Any, k: int | None, view: str, side: str = "after") -> str:
    """DOT source of shown version `k` (see `picture`)."""
    return Picture(state, k, view, side).dot()


def render_svg(state: Any, k: int | None, view: str, side: str = "after") -> str:
    """SVG of shown version `k`, cached across sessions under the key of the graph actually drawn
    (`Picture.key`: trace content, version, view, side), never under controls that may have moved on."""
    pic = Picture(state, k, view, side)
    return RENDERS.get_or_compute(pic.key, lambda: _viz().render_svg(pic.dot()).svg)


# -- runtime ----------------------------------------------------------------------------------------

def blas_summary() -> str:
    """Which BLAS MLX's CPU matmul uses (`rlxviz.runtime.mlx_backend.blas_summary`)."""
    return _attr("rlxviz.runtime.mlx_backend", "blas_summary", "the MLX runtime")()


def time_graph(graph: Graph, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray], repeat: int,
               reference: list[np.ndarray] | None) -> tuple[Any, float]:
    """(Timing, max abs error vs `reference`) of one version on MLX (`rlxviz.runtime.timing`)."""
    timing = _module("rlxviz.runtime.timing", "the MLX runtime")
    t = timing.time_version(graph, feeds, weights, warmup=2, repeat=repeat)
    diffs = timing.equivalence(graph, feeds, weights, reference_outputs=reference)
    return t, max((d.max_abs for d in diffs), default=0.0)


def reference_outputs(graph: Graph, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The NumPy reference interpreter's outputs for the unfused graph."""
    from ..runtime import run_reference

    return run_reference(graph, feeds, weights)
