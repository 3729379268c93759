"""Helpers shared by the teaching notebooks and the debugging commands (`rlxviz explain`, `render`, `ir`, ...).

Everything here is a thin, tested layer over the library: loading a model from a preset name, a
checkpoint folder or an IR text file (`load`); building a pipeline from a profile or a list of pass
names (`pipeline_from`); per-layer fusion status with the first rejecting guard (`layer_status`,
`check_fusion`); the pass catalogue (`pass_catalog`); timing every graph version on MLX against
the reference (`time_versions`); the memory traffic a fusion saves (`traffic_saved`); and SVG
wrapped for Jupyter so large graphs scroll instead of being clipped (`svg_html`, `show`).

Errors a user can fix are raised as `TeachError` with a one-line message (the CLI prints it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .ir import Graph, IRSyntaxError, Op, from_json, lint, parse_ir
from .models import PRESETS, VARIANTS, Model, Variant, load_checkpoint, load_model, random_weights
from .passes import PASSES, Outcome, Pipeline, Trace, explain, layer_of, missed_fusions
from .passes.pipeline import RLX_FAB_MAX_TOKENS
from .passes.trace import PassStep

RLX_THRESHOLD = RLX_FAB_MAX_TOKENS
"""RLX's default batch*seq gate for attention fusion (`fab_max_tokens` of the `rlx` profile)."""

OVER_THRESHOLD = "over_threshold"
"""The pseudo-variant that teaches the size gate: `fab_max_tokens` = 64 and batch*seq above it."""

TEACHING_CASES: dict[str, str] = {
    "output_intermediate": "h1 (the post-attention LayerNorm) is also returned as a graph output",
    "extra_h1_user": "a third reader of h1 (a probe `reduce_mean` returned as an extra output)",
    "tanh_gelu": "the FFN uses tanh-approximated GELU instead of exact (erf) GELU",
    "pre_ln": "pre-LayerNorm ordering x + attn(LN(x)), as in GPT-2 / LLaMA",
    "swapped_residual": "residual adds written skip-first: add(hidden, branch)",
    OVER_THRESHOLD: "batch*seq above RLX's attention-fusion gate of 64 tokens (rlx profile)",
}
"""Every teaching variant with one line on what it changes (in layer `variant_layer`, default 0)."""


class TeachError(ValueError):
    """A user error with a one-line message (unknown model, bad IR text, unknown pass, bad layer)."""


# ---------------------------------------------------------------------------------------------- memory

DEFAULT_MAX_MEMORY_MB = 2048
"""Default limit (MiB) on what a command may allocate up front for a graph's inputs and params."""

MAX_MEMORY_ENV = "RLXVIZ_MAX_MEMORY_MB"
"""Environment variable overriding `DEFAULT_MAX_MEMORY_MB` (the CLI option `--max-memory-mb` wins)."""


def memory_limit_mb(option: int | None = None) -> int:
    """The allocation limit in MiB: `option` if given, else `$RLXVIZ_MAX_MEMORY_MB`, else 2048.

    Raises:
        TeachError: the option or the variable is not a positive integer.
    """
    if option is not None:
        if option < 1:
            raise TeachError(f"--max-memory-mb must be a positive integer (MiB), got {option}")
        return option
    env = os.environ.get(MAX_MEMORY_ENV, "").strip()
    if not env:
        return DEFAULT_MAX_MEMORY_MB
    try:
        value = int(env)
    except ValueError:
        value = 0
    if value < 1:
        raise TeachError(f"{MAX_MEMORY_ENV}={env!r}: must be a positive integer (MiB)")
    return value


def _size(n: int) -> str:
    """Bytes as a short human string (B, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def check_memory(graph: Graph, limit_mb: int, source: str, inputs: bool = True, params: bool = True) -> int:
    """Refuse a graph whose inputs and/or params (their `node.nbytes`) exceed `limit_mb` MiB, before
    anything is allocated for them.

    Returns:
        The bytes needed (inputs + params as selected).

    Raises:
        TeachError: over the limit; the message names the largest tensor and how to raise the limit.
    """
    nodes = (graph.inputs if inputs else []) + (graph.params if params else [])
    total = sum(n.nbytes for n in nodes)
    if total > limit_mb * (1 << 20):
        big = max(nodes, key=lambda n: n.nbytes)
        what = " and ".join(w for w, on in (("inputs", inputs), ("params", params)) if on)
        raise TeachError(f"{source}: its {what} need {_size(total)} ({big.name} {big.type} alone "
                         f"{_size(big.nbytes)}), over the {limit_mb} MiB limit; raise it with --max-memory-mb "
                         f"or {MAX_MEMORY_ENV} if the machine has the memory")
    return total


# ---------------------------------------------------------------------------------------------- models

def variant_named(name: str | None, layer: int = 0) -> Variant | None:
    """The `Variant` for a teaching-variant name, applied to `layer` (None for `none`, None or `over_threshold`).

    Raises:
        TeachError: unknown name (the message lists the known ones).
    """
    if name in (None, "none", OVER_THRESHOLD, "threshold"):
        return None
    if name not in VARIANTS:
        raise TeachError(f"unknown variant {name!r}; known: {', '.join(['none', *TEACHING_CASES])}")
    return dataclasses.replace(VARIANTS[name], layer=layer)


def _one_line_syntax_error(path: str, e: IRSyntaxError) -> str:
    return f"{path}:{e.line}:{e.col}: IR syntax error: {e.reason}"


def load_ir_file(path: str | Path, max_memory_mb: int | None = None) -> Model:
    """A model from an IR text file (`format_graph` form) or a graph JSON file (`to_json`), linted,
    with seeded random float32 weights made from its param shapes (`models.random_weights`).

    Args:
        path: the file.
        max_memory_mb: limit on the params' bytes (`memory_limit_mb`: default 2048 MiB or the env var).

    Raises:
        TeachError: unreadable file, IR syntax error (message `FILE:LINE:COL: ...`), an invalid graph,
            or params larger than the memory limit.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TeachError(f"{path}: cannot read IR text ({type(e).__name__}: {e})") from None
    try:
        g = from_json(text) if p.suffix.lower() == ".json" else parse_ir(text)
    except IRSyntaxError as e:
        raise TeachError(_one_line_syntax_error(str(path), e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise TeachError(f"{path}: not a valid graph: {_first_line(e)}") from None
    try:
        g = lint(g, "parse")
    except Exception as e:  # noqa: BLE001 - GraphError and friends: report in one line
        raise TeachError(f"{path}: invalid graph: {_first_line(e)}") from None
    check_memory(g, memory_limit_mb(max_memory_mb), str(path), inputs=False)
    return Model(g.name, g, random_weights(g, seed=0), None, f"graph from {p.name} (random weights)",
                 meta={"ir_file": str(p)})


def _first_line(e: BaseException) -> str:
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    return str(msg).strip().splitlines()[0] if str(msg).strip() else type(e).__name__


def load(model: str, batch: int = 1, seq: int = 128, style: str | None = None, variant: str | None = None,
         variant_layer: int = 0, max_memory_mb: int | None = None) -> Model:
    """A model by preset name, Hugging Face checkpoint folder, or IR text file.

    Args:
        model: a preset (`bert-tiny`, `minilm`, ...), a folder with config.json + model.safetensors,
            or a file with IR text (`.json`: the graph's JSON form). IR files get random weights.
        batch / seq: static input shape of the built graph (ignored for IR files).
        style: `hf` or `rlx` BERT form (None: the preset's own style; `hf` for folders).
        variant: a teaching variant name (`TEACHING_CASES`) changing layer `variant_layer`.
        max_memory_mb: limit on an IR file's param bytes (see `load_ir_file`).

    Raises:
        TeachError: unknown model or variant, unreadable or malformed IR (with line and column),
            a variant asked of an IR file, or a checkpoint the loader refuses.
    """
    v = variant_named(variant, variant_layer)
    if variant in (OVER_THRESHOLD, "threshold"):
        seq = max(seq, RLX_THRESHOLD // max(batch, 1) + 1)
    kwargs: dict[str, Any] = {"variant": v}
    if style is not None:
        kwargs["style"] = style
    try:
        if model in PRESETS:
            return load_model(model, batch=batch, seq=seq, **kwargs)
        p = Path(model)
        if p.is_dir():
            return load_checkpoint(p, batch, seq, **kwargs)
        if p.is_file():
            if v is not None:
                raise TeachError(f"{model}: teaching variants apply to BERT presets and checkpoints, not IR files")
            return load_ir_file(p, max_memory_mb)
    except TeachError:
        raise
    except (ValueError, KeyError, OSError) as e:
        msg = _first_line(e)
        raise TeachError(msg if msg.startswith(model) else f"{model}: {msg}") from None
    raise unknown_model(model)


PATH_SUFFIXES = (".ir", ".txt", ".json")
"""Suffixes that make a MODEL argument look like a file path (as does a `/`)."""


def unknown_model(model: str, what: str = "a checkpoint folder nor an IR text file") -> TeachError:
    """The error for a MODEL that is neither a preset nor an existing path: `FILE: no such file or folder`
    when it looks like a path (contains `/` or ends in .ir/.txt/.json), else `unknown model ...`."""
    if "/" in model or model.lower().endswith(PATH_SUFFIXES):
        return TeachError(f"{model}: no such file or folder (MODEL is a preset name or an existing path)")
    return TeachError(f"unknown model {model!r}: not a preset ({', '.join(sorted(PRESETS))}), {what}")


def model_layers(graph: Graph) -> list[int]:
    """Layer indices present in the graph's node paths (`encoder.layer.3...` -> 3), sorted."""
    return sorted({i for n in graph if (i := layer_of(n.path)) is not None})


# -------------------------------------------------------------------------------------------- pipelines

def pipeline_from(spec: str | Sequence[str] = "canonical", params: Mapping[str, Any] | None = None) -> Pipeline:
    """A pipeline from a profile name (`canonical`, `rlx`) or pass names (a list, or one comma-separated string).

    Raises:
        TeachError: an unknown pass name (the message lists the known ones), or an empty list.
    """
    if isinstance(spec, str) and spec in ("canonical", "rlx"):
        pipe = Pipeline.profile(spec)
    else:
        names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
        if not names:
            raise TeachError("empty pipeline: give a profile (canonical, rlx) or pass names separated by commas")
        unknown = [n for n in names if n not in PASSES]
        if unknown:
            raise TeachError(f"unknown pass {unknown[0]!r}; known: {', '.join(PASSES)} (or a profile: canonical, rlx)")
        pipe = Pipeline(names, {}, "custom")
    pipe.params.update(params or {})
    return pipe


def pass_catalog(pipeline: Pipeline | None = None) -> list[dict[str, Any]]:
    """Each pass of `pipeline` (default canonical), in order: name, doc, requires, and its rules with
    their docs and guard names (structure steps and guards, in the order they run)."""
    pipe = pipeline or Pipeline.canonical()
    out = []
    for p in pipe.active():
        out.append({"name": p.name, "doc": p.doc, "requires": list(p.requires),
                    "rules": [{"name": r.name, "doc": r.doc, "guards": r.guard_names} for r in p.rules]})
    return out


def format_passes(pipeline: Pipeline | None = None) -> str:
    """`pass_catalog` as text: one block per pass, one line per rule, its guards wrapped below."""
    pipe = pipeline or Pipeline.canonical()
    params = {k: v for k, v in pipe.effective_params.items()}
    lines = [f"{pipe.name} pipeline ({len(pipe.active())} passes; params: "
             + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"]
    for i, p in enumerate(pass_catalog(pipe), 1):
        req = f"  [after: {', '.join(p['requires'])}]" if p["requires"] else ""
        lines.append(f"{i:2d}. {p['name']}: {p['doc']}{req}")
        if not p["rules"]:
            lines.append("      (no patterns: a graph-wide pass)")
        for r in p["rules"]:
            lines.append(f"      {r['name']}" + (f": {r['doc']}" if r["doc"] else ""))
            lines += _wrap("guards: " + ", ".join(r["guards"]), 10, 110)
    return "\n".join(lines)


def _wrap(text: str, indent: int, width: int) -> list[str]:
    words, lines, cur = text.split(" "), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width - indent:
            lines.append(" " * indent + cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(" " * indent + cur)
    return lines


def version_index(trace: Trace, after: str) -> int:
    """Index into `trace.versions()` for `after`: `input`, `final`, a pass name (its first run), or
    `NAME#K` (its K-th run, 1-based).

    Raises:
        TeachError: the pass did not run in this pipeline (the message lists those that did).
    """
    if after == "input":
        return 0
    if after == "final":
        return len(trace.steps)
    name, _, k = after.partition("#")
    runs = [i for i, s in enumerate(trace.steps, 1) if s.pass_name == name]
    try:
        nth = int(k) if k else 1
    except ValueError:
        nth = 0
    if name not in PASSES:
        raise TeachError(f"unknown pass {name!r}; known: {', '.join(PASSES)} (or input, final)")
    if not runs or not 1 <= nth <= len(runs):
        ran = ", ".join(dict.fromkeys(s.pass_name for s in trace.steps))
        what = f"run {nth} of {name!r}" if runs else f"pass {name!r}"
        raise TeachError(f"{what} is not in this pipeline; it ran: {ran}")
    return runs[nth - 1]


# ------------------------------------------------------------------------------------------ explanation

@dataclass
class LayerStatus:
    """Whether one layer fused as expected, and if not, why.

    Attributes:
        layer: the layer index.
        fused: True when every expected fusion happened: for a post-LN BERT-style layer one
            `FusedTransformerLayer` (when the pipeline ran `fuse_transformer_layer`), and for every layer
            no rejection that survives to the final graph (a missed fusion) among the rules expected
            for its architecture (see `layer_status`).
        fused_node: id of the layer's FusedTransformerLayer in the final graph, if any.
        expected: what was expected, e.g. `FusedTransformerLayer`, or for a LLaMA layer
            `FusedSwiGLU, shared-input QKV matmul`.
        first: the first rejecting rule's outcome (guard, actual vs required message, hint), if any.
        rejections: every rejected outcome of the layer, in pipeline order.
        misses: missed fusions in this layer (`passes.missed_fusions`), as text.
        sibling / differences: a sibling layer where the rejected rule fused, and how the two layers'
            primitive structures differ (`passes.explain`).
        explanation: the full `explain` text (one line per rule).
        architecture: what the layer is (`layer_architecture`), e.g. `attention -> residual add -> LayerNorm
            (post-LN BERT style)` or `RmsNorm, no LayerNorm after the attention residual (LLaMA style)`.
        bert_style: the layer is a post-LN BERT-style layer, so a FusedTransformerLayer is expected.
        done: the fusions that happened in the layer, e.g. `FusedSwiGLU %31` (non-BERT layers).
        not_expected: rejections that do not count for this architecture, with the reason (e.g. the
            BERT-only layer and attention-block fusions in a LLaMA layer, or a residual-norm fusion that
            would be illegal in a pre-norm layer).
    """

    layer: int
    fused: bool
    fused_node: int | None
    expected: str
    first: Outcome | None
    rejections: list[Outcome] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    sibling: int | None = None
    sibling_rule: str = ""
    differences: list[str] = field(default_factory=list)
    explanation: str = ""
    architecture: str = ""
    bert_style: bool = True
    done: list[str] = field(default_factory=list)
    not_expected: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (outcomes as dicts)."""
        d = dataclasses.asdict(self)
        d["status"] = "fused" if self.fused else "not fused"
        return d

    def render(self, verbose: bool = False) -> str:
        """A few lines: status, the first rejecting guard (actual vs required), hint, sibling diff."""
        if self.fused and self.bert_style:
            where = f" -> {self.expected} %{self.fused_node}" if self.fused_node is not None else ""
            lines = [f"layer {self.layer}: fused{where}"]
        elif self.fused:
            lines = [f"layer {self.layer}: fused as expected: " + (", ".join(self.done) or "nothing to fuse")]
        else:
            lines = [f"layer {self.layer}: NOT fused" + (f" (expected {self.expected})" if self.expected else "")]
            if self.first is not None:
                o = self.first
                lines.append(f"  first rejection: {o.rule}")
                lines.append(f"    guard {o.guard} ({o.stage}): {o.message}")
                if o.hint:
                    lines.append(f"    fix: {o.hint}")
            others = [o for o in self.rejections if o is not self.first]
            for o in others:
                lines.append(f"  also rejected: {o.rule}: {o.guard}")
            if self.sibling is not None:
                lines.append(f"  layer {self.sibling} fused with {self.sibling_rule}; the layers differ in:")
                lines += [f"    {d}" for d in self.differences] or ["    (same primitive structure)"]
        if not self.bert_style:
            lines.append(f"  layer kind: {self.architecture}")
            lines.append(f"  expected: {self.expected or 'no fusion'} (FusedTransformerLayer only for post-LN "
                         "BERT layers)")
            lines += [f"  not expected here: {x}" for x in self.not_expected]
        if verbose and self.explanation:
            lines += ["  " + ln for ln in self.explanation.splitlines()]
        return "\n".join(lines)


PRODUCTS: dict[str, str] = {
    "fuse_sdpa": "packed attention", "fuse_swiglu": "FusedSwiGLU",
    "fuse_shared_input_matmul": "shared-input QKV matmul",
    "fuse_matmul_bias_act": "FusedMatMulBiasAct", "fuse_attention_block": "FusedAttentionBlock",
    "fuse_residual_ln": "FusedResidualLN", "fuse_residual_rms_norm": "FusedResidualRmsNorm",
    "fuse_transformer_layer": "FusedTransformerLayer",
}
"""What each pattern pass produces, as named in `explain`'s per-layer expectations."""

BERT_ONLY_PASSES: dict[str, str] = {
    "fuse_transformer_layer": "FusedTransformerLayer is the post-LN BERT layer",
    "fuse_attention_block": "FusedAttentionBlock is the BERT encoder attention (keep mask, biased packed QKV)",
}
"""Passes whose fusions are only expected in post-LN BERT-style layers, with the reason."""

PRE_NORM_GUARDS = {"sum_single_user"}
"""Residual-norm guards that mean the fusion is illegal in a pre-norm layer (the residual sum also feeds
the next residual add), not that something went wrong."""


def layer_architecture(graph: Graph, layer: int) -> tuple[bool, str]:
    """`(bert_style, description)` of `layer` in `graph` (use the unfused input graph).

    A layer is BERT-style (post-LN: one `FusedTransformerLayer` expected) when it has attention and a
    residual add feeding a LayerNorm (the attention output's residual), or already holds a
    FusedResidualLN / FusedTransformerLayer. Anything else (a LLaMA block: RmsNorm, pre-norm, SwiGLU)
    is not, and is expected to get only the fusions the pipeline's rules apply to it.
    """
    nodes = [n for n in graph if layer_of(n.path) == layer and n.op not in (Op.INPUT, Op.PARAM, Op.CONST)]
    ops = {n.op for n in nodes}
    attention = bool(ops & {Op.ATTENTION, Op.SOFTMAX, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER})
    ln_residual = bool(ops & {Op.FUSED_RESIDUAL_LN, Op.FUSED_TRANSFORMER_LAYER}) or any(
        n.op == Op.ADD and any(u.op == Op.LAYER_NORM for u in graph.users(n.id)) for n in nodes)
    if attention and ln_residual:
        return True, "attention -> residual add -> LayerNorm (post-LN BERT style)"
    norm = ("RmsNorm" if Op.RMS_NORM in ops or Op.FUSED_RESIDUAL_RMS_NORM in ops
            else "LayerNorm" if Op.LAYER_NORM in ops else "no norm")
    if not attention:
        return False, f"no attention ({norm})"
    style = ": LLaMA style" if norm == "RmsNorm" else ""
    return False, f"attention + {norm}, no LayerNorm on the attention residual{style}"


def _op_of(trace: Trace, node: int) -> str:
    """The op of node id `node` in the first version that has it."""
    for _, g in trace.versions():
        if node in g:
            return g[node].op.value
    return "?"


def layer_status(trace: Trace, layer: int) -> LayerStatus:
    """`LayerStatus` of `layer` in a pipeline run.

    What is expected depends on the layer's architecture (`layer_architecture`): a post-LN BERT-style
    layer must become one FusedTransformerLayer (when the pipeline runs `fuse_transformer_layer`) with no
    missed fusion left; any other layer (e.g. LLaMA) must be left with no missed fusion among the rules
    that apply to it: BERT-only fusions and residual-norm fusions that a pre-norm layout makes illegal are
    listed as not expected instead of counted as failures.
    """
    ex = explain(trace, layer)
    final = trace.final
    ran = {s.pass_name for s in trace.steps if not s.error}
    bert_style, arch = layer_architecture(trace.input, layer)
    expect_ftl = "fuse_transformer_layer" in ran and bert_style
    ftl = [n.id for n in final if n.op == Op.FUSED_TRANSFORMER_LAYER and layer_of(n.path) == layer]
    misses = [m for m in missed_fusions(trace) if layer_of(m.path) == layer]
    not_expected: list[str] = []
    if not bert_style:
        def why_not(pattern: str, guard: str) -> str | None:
            pass_name = pattern.split(".")[0]
            if pass_name in BERT_ONLY_PASSES:
                return BERT_ONLY_PASSES[pass_name]
            if pass_name in ("fuse_residual_ln", "fuse_residual_rms_norm") and guard in PRE_NORM_GUARDS:
                return "pre-norm layout: the residual sum also feeds the next residual add, so it cannot be fused"
            return None

        kept = []
        for m in misses:
            reason = why_not(m.pattern, m.guard)
            if reason is None:
                kept.append(m)
            elif not any(x.startswith(f"{m.pattern} ") for x in not_expected):
                not_expected.append(f"{m.pattern} ({m.guard}): {reason}")
        skipped = {x.split(" ")[0] for x in not_expected}
        misses = kept
    miss_keys = {(m.pattern, m.node) for m in misses}
    rejected = ex.rejected
    if not bert_style:
        rejected = [o for o in rejected if o.rule not in skipped]
    surviving = [o for o in rejected if any((o.rule, a) in miss_keys for a in o.nodes)]
    fused = (bool(ftl) or not expect_ftl) and not misses
    first = None if fused else (surviving[0] if surviving else (rejected[0] if rejected else None))
    if first is None and not fused and expect_ftl and not ftl and not misses:
        first = Outcome("fuse_transformer_layer", "fuse_transformer_layer.bert_post_ln", "rejected", "no_anchor",
                        "structure", "fuse_transformer_layer found no attention op in this layer to anchor on when it "
                        "ran (a Hugging Face graph has none until fuse_sdpa packs one)",
                        "run fuse_sdpa and the block fusions before fuse_transformer_layer")
    if first is None and not fused and misses:
        m = misses[0]
        first = Outcome(m.pattern.split(".")[0], m.pattern, "rejected", m.guard, "", m.reason, m.hint, (m.node,))
    done: list[str] = []
    expected = "FusedTransformerLayer" if expect_ftl else ""
    if not bert_style:
        done = [f"{_op_of(trace, n)} %{n} ({o.pass_name})" for o in ex.outcomes if o.status == "fused"
                for n in o.nodes]
        wanted = [o.pass_name for o in ex.outcomes if o.status == "fused" or o in rejected]
        expected = ", ".join(PRODUCTS.get(n, n) for n in dict.fromkeys(wanted))
    return LayerStatus(layer, fused, ftl[0] if ftl else None, expected,
                       first, rejected, [str(m) for m in misses], ex.sibling, ex.sibling_rule, list(ex.differences),
                       ex.render(), arch, bert_style, done, not_expected)


@dataclass
class FusionCheck:
    """`check_fusion`'s result: `ok` when every layer checked fused as expected."""

    model: str
    pipeline: str
    layers: list[LayerStatus]
    counts: dict[str, int]
    misses: list[str] = field(default_factory=list)
    """For a graph whose node paths name no layer: every missed fusion of the run (then `ok` means none)."""

    @property
    def ok(self) -> bool:
        return all(s.fused for s in self.layers) and not self.misses

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "pipeline": self.pipeline, "ok": self.ok,
                "fused_layers": sum(s.fused for s in self.layers), "checked_layers": len(self.layers),
                "final_op_counts": self.counts, "layers": [s.to_dict() for s in self.layers],
                "misses": self.misses}

    def render(self, verbose: bool = False) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items()) or "no fused ops"
        if not self.layers:
            head = [f"{self.model} ({self.pipeline} pipeline): no node path names a layer; final graph: {counts}",
                    f"{len(self.misses)} missed fusion(s)" + (":" if self.misses else "")]
            return "\n".join(head + [f"  {m}" for m in self.misses])
        head = (f"{self.model} ({self.pipeline} pipeline): {sum(s.fused for s in self.layers)}/{len(self.layers)} "
                f"layer(s) fused as expected")
        return "\n".join([head, *(s.render(verbose) for s in self.layers)])


def check_fusion(trace: Trace, model: str = "", layers: Iterable[int] | None = None) -> FusionCheck:
    """Status of every layer (or of `layers`) of a run.

    Raises:
        TeachError: a requested layer is not in the model (the message gives the layers it has).
    """
    have = model_layers(trace.input)
    wanted = list(have if layers is None else layers)
    for i in wanted:
        if i not in have:
            span = f"{have[0]}..{have[-1]}" if have else "none: no node path names a layer"
            raise TeachError(f"layer {i} is not in {model or 'the model'} (layers: {span})")
    fused_counts = {k: v for k, v in trace.final.op_counts().items() if k[:1].isupper()}
    misses = [str(m) for m in missed_fusions(trace)] if not have else []
    return FusionCheck(model, trace.pipeline, [layer_status(trace, i) for i in wanted], fused_counts, misses)


# ---------------------------------------------------------------------------------------------- timing

@dataclass
class VersionTiming:
    """One row of the per-version timing table.

    Attributes:
        index / label: position in `trace.versions()` and its label (`input`, `after fuse_sdpa`, ...).
        nodes: ops (compute nodes: inputs, params and consts not counted) in the version.
        median_ms / min_ms / first_call_ms: MLX timing (`runtime.time_version`), None when `same_as` is set.
        max_abs: max |MLX output - NumPy reference of the unfused graph| over all outputs (nan when
            either side holds NaN or infinities).
        ok: every output within the tolerance (`runtime.equivalence`) and every output, of the version
            and of the reference, finite: NaN never counts as correct.
        finite: the version's outputs and the reference outputs hold only finite values.
        same_as: index of an earlier identical version (the pass changed nothing; not re-timed).
    """

    index: int
    label: str
    nodes: int
    median_ms: float | None = None
    min_ms: float | None = None
    first_call_ms: float | None = None
    max_abs: float | None = None
    ok: bool | None = None
    same_as: int | None = None
    finite: bool = True


def time_versions(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                  warmup: int = 1, repeat: int = 5, rtol: float = 1e-3, atol: float = 1e-4) -> list[VersionTiming]:
    """Time every distinct graph version of a run on MLX and check it against the reference.

    The reference is the NumPy interpreter on the unfused input graph, computed once. Versions that
    a pass did not change are listed with `same_as` and not re-timed. A version is `ok` only when its
    outputs are close to the reference and finite, and the reference itself is finite
    (`runtime.equivalence` compares with `equal_nan=True`, so NaN against NaN would pass there).
    """
    from .runtime import equivalence, run_reference, time_version

    ref = run_reference(trace.input, dict(feeds), dict(weights))
    ref_finite = all_finite(ref)
    rows: list[VersionTiming] = []
    last = 0
    for i, (label, g) in enumerate(trace.versions()):
        compute = len(g.compute_nodes()) if hasattr(g, "compute_nodes") else len(g)
        if i > 0 and not trace.steps[i - 1].changed:
            rows.append(VersionTiming(i, label, compute, same_as=last))
            continue
        t = time_version(g, feeds, weights, warmup=warmup, repeat=repeat)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: reported as not finite, not warned
            diffs = equivalence(g, feeds, weights, reference_outputs=ref, rtol=rtol, atol=atol)
        max_abs = max(d.max_abs for d in diffs)
        # |got - ref| is nan or inf exactly when one side is not finite (the reference is checked too)
        finite = ref_finite and bool(np.isfinite(max_abs))
        rows.append(VersionTiming(i, label, compute, t.median_ms, t.min_ms, t.first_call_ms,
                                  max_abs, finite and all(d.ok for d in diffs), finite=finite))
        last = i
    return rows


def format_timings(rows: Sequence[VersionTiming]) -> str:
    """The timing table as aligned text (ops per version; ms; error = max abs vs the reference)."""
    w = max(len(r.label) for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'ops':>5}  {'median ms':>9}  {'min ms':>8}  {'first ms':>8}  "
             f"{'max abs err':>11}  ok"]
    for r in rows:
        if r.same_as is not None:
            lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  (unchanged: same as #{r.same_as})")
            continue
        lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  {r.median_ms:>9.2f}  {r.min_ms:>8.2f}  "
                     f"{r.first_call_ms:>8.1f}  {r.max_abs:>11.2e}  "
                     + ("yes" if r.ok else "NO" if r.finite else "NO (non-finite output)"))
    return "\n".join(lines)


def all_finite(arrays: Iterable[np.ndarray]) -> bool:
    """True when every float array holds only finite values (integer arrays always do)."""
    return all(np.isfinite(a).all() for a in map(np.asarray, arrays) if a.dtype.kind in "fc")


def nonfinite_arrays(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Names of the float arrays holding NaN or infinities (e.g. a checkpoint's corrupted weights)."""
    return [k for k, a in arrays.items() if np.asarray(a).dtype.kind in "fc" and not np.isfinite(a).all()]


# ------------------------------------------------------------------------------------- memory traffic

@dataclass(frozen=True)
class Traffic:
    """Memory traffic a pass removed: intermediates that fused nodes no longer write or read.

    Attributes:
        intermediates: per removed intermediate, `(node id, op, bytes, users)`: its output tensor of
            `bytes` (node.nbytes) was written once and read by `users` nodes before the fusion.
        bytes_written / bytes_read: totals over the intermediates (bytes).
    """

    intermediates: tuple[tuple[int, str, int, int], ...]
    bytes_written: int
    bytes_read: int

    @property
    def total(self) -> int:
        return self.bytes_written + self.bytes_read

    def __str__(self) -> str:
        return (f"{len(self.intermediates)} intermediate tensor(s) no longer materialized: "
                f"{_kib(self.bytes_written)} not written + {_kib(self.bytes_read)} not read = {_kib(self.total)}")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def traffic_saved(step: PassStep) -> Traffic:
    """Bytes of intermediates a pass's fusions no longer write to and read from memory.

    An intermediate is a compute node the pass absorbed whose every reader was absorbed too and
    which is not a graph output (the match's result is still written by the fused node, so it is
    not counted). Its tensor was written once (`node.nbytes`) and read once per user.
    """
    before, after = step.before, step.after
    items = []
    for m in step.matches:
        if m.fused is None or m.fused not in after:
            continue
        absorbed = set(after[m.fused].absorbed)
        for i in sorted(absorbed):
            if i not in before:
                continue
            n = before[i]
            users = before.users(i)
            if before.is_output(i) or any(u.id not in absorbed for u in users) or i in after:
                continue
            items.append((i, n.op.value, n.nbytes, len(users)))
    return Traffic(tuple(items), sum(b for _, _, b, _ in items), sum(b * u for _, _, b, u in items))


# --------------------------------------------------------------------------------------------- display

def svg_html(svg: str, max_height: int = 560, caption: str = "") -> str:
    """SVG text wrapped in a scrolling `<div>` (large graphs scroll instead of being clipped)."""
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    cap = f'<div style="font:12px sans-serif;color:#444;margin:2px 0">{caption}</div>' if caption else ""
    return (f'{cap}<div class="rlxviz-graph" style="overflow:auto;max-height:{max_height}px;max-width:100%;'
            f'border:1px solid #ddd;padding:4px">{body}</div>')


def pair_html(left: str, right: str, max_height: int = 560, captions: tuple[str, str] = ("before", "after")) -> str:
    """Two SVG drawings side by side, each in its own scrolling box (narrow screens wrap them)."""
    cells = "".join(f'<div style="flex:1 1 420px;min-width:0">{svg_html(s, max_height, c)}</div>'
                    for s, c in zip((left, right), captions, strict=True))
    return f'<div style="display:flex;gap:8px;flex-wrap:wrap">{cells}</div>'


def show_step(step: PassStep, max_height: int = 560, **kw: Any) -> Any:
    """A pass's before (matches clustered, rejections marked) and after (fused nodes marked) drawings,
    side by side, as an IPython HTML object. `kw` goes to `viz.render_svg` (e.g. `focus=0`)."""
    from IPython.display import HTML

    from .viz import Overlay, render_svg

    before = render_svg(step.before, Overlay.before(step), **kw).svg
    after = render_svg(step.after, Overlay.after(step), **kw).svg
    return HTML(pair_html(before, after, max_height, (f"before {step.pass_name}", f"after {step.pass_name}")))


def show(graph: Graph, overlay: Any = None, max_height: int = 560, caption: str = "", **kw: Any) -> Any:
    """The app's renderer (`viz.render_svg`) as an IPython HTML object for a notebook cell."""
    from IPython.display import HTML

    from .viz import render_svg

    return HTML(svg_html(render_svg(graph, overlay, **kw).svg, max_height, caption))


__all__ = ["BERT_ONLY_PASSES", "DEFAULT_MAX_MEMORY_MB", "MAX_MEMORY_ENV", "OVER_THRESHOLD", "PRODUCTS",
           "RLX_THRESHOLD", "TEACHING_CASES", "FusionCheck", "LayerStatus", "TeachError", "Traffic", "VersionTiming",
           "all_finite", "check_fusion", "check_memory", "format_passes", "format_timings", "layer_architecture",
           "layer_status", "load", "load_ir_file", "memory_limit_mb", "unknown_model", "model_layers",
           "nonfinite_arrays", "pair_html", "pass_catalog", "pipeline_from", "show", "show_step", "svg_html",
           "time_versions", "traffic_saved", "variant_named", "version_index"]
