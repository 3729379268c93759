"""Pipelines: an ordered, editable list of passes plus parameters; `run(graph) -> Trace`.

The canonical order starts from RLX's newer order (docs/rlx.md §2.2) and fixes it:

0. `canonicalize_exported` - new: the forms exporters write (`x * sigmoid(x)`, `1 / sqrt`, the padding-mask sum,
   the sdpa NaN guard) become the ops the rules below match; the ONNX importer maps one to one and leaves them here.
   `canonicalize_norm`, `canonicalize_gelu` - new: LayerNorm / RMSNorm / GELU written as primitives become
   `layer_norm` / `rms_norm` / `gelu` / `gelu_tanh` (or a named rejection says why not), so the fusions below,
   which match those ops, see them.
1. `fuse_sdpa` - new (RLX has no pass for Hugging Face attention primitives). Must come first:
   every block fusion below anchors on a packed `attention`. Its exact canonicalizations run first, each a step of
   the trace of its own (`fuse_sdpa/unfold_heads`, ..., `fuse_sdpa/uninvert_where`: `Pass.stages`, `STAGES`), then
   its own rule as the step `fuse_sdpa`; `Pipeline.disable` switches one stage off.
2. `fuse_swiglu` - RLX runs its dual-matmul form after the residual norms; here it runs before
   `fuse_shared_input_matmul` (RLX's own constraint, "DualMatmul before SharedInput") and before
   `fuse_matmul_bias_act` so gate/up pairs are seen as a pair.
3. `fuse_shared_input_matmul` - RLX runs it *after* `fuse_matmul_bias_act` (step 12 vs 3), so Q/K/V
   projections with biases (every HF BERT) are already `FusedMatMulBiasAct`s and never merge. Here
   it runs before, and merges the biases too, so an HF checkpoint reaches RLX's packed-QKV form.
4. `fuse_matmul_bias_act` - as RLX (must precede the block fusions that match its output).
5. `fuse_attention_block` - as RLX's newer order, after matmul+bias.
6. `fuse_residual_ln`, 7. `fuse_residual_rms_norm` - as RLX.
8. `fuse_transformer_layer` - on by default (RLX: opt-in env var), after its prerequisites.
9. `dead_code_elimination` - moved before region marking (RLX: last) so dead mask arithmetic left by
   `fuse_sdpa` is not packed into regions first; it runs again at the end.
10. `mark_elementwise_regions` - as RLX's MLX path (regions kept, not unfused).
11. `dead_code_elimination`.

RLX's `fuse_rms_norm_reshape` and control-flow lowering have no counterpart (no such ops here).

Parameters (`Pipeline.params`): `fab_max_tokens` (None = no gate; the `rlx` profile uses 64),
`max_region_steps` (32), `max_region_inputs` (16), `unfuse_ops` (for `unfuse`: op names or None),
`merge_cost_test` (True: `fuse_shared_input_matmul` never merges a matmul whose merge would cost a fusion).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..ir import Graph, lint
from ..ir.identity import definitions_changed
from .engine import Pass, check_records
from .guard import COMPILER_ONLY, role_name
from .params import PARAM_NAMES, PipelineParams, check_params
from .rules.attention import fuse_sdpa
from .rules.block import PRE_ROPE_SCALE_FIX, fuse_attention_block
from .rules.cleanup import dead_code_elimination, mark_elementwise_regions, unfuse
from .rules.export_forms import canonicalize_exported
from .rules.gelu_forms import canonicalize_gelu
from .rules.layer import fuse_transformer_layer
from .rules.linear import fuse_matmul_bias_act
from .rules.norm import fuse_residual_ln, fuse_residual_rms_norm
from .rules.norm_forms import canonicalize_norm
from .rules.scale_blame import pre_rope_hint, pre_rope_scale, scale_origin
from .rules.scale_fold import fold_hint, scale_fold
from .rules.shared_input import fuse_shared_input_matmul
from .rules.swiglu import fuse_swiglu
from .spelling import close
from .trace import PassStep, Rejection, Trace, family_of


class PassRegistry(dict[str, Pass]):
    """`PASSES`: a dict of passes by name that, when a pass is added, replaced or removed, empties every cache of a
    view derived from a graph or a run (`ir.identity.definitions_changed`: those views read the pass definitions,
    e.g. a guard's declared excuse, and are keyed by content, which the change does not alter)."""

    def __setitem__(self, name: str, p: Pass) -> None:
        super().__setitem__(name, p)
        definitions_changed()

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        definitions_changed()

    def pop(self, *args: Any) -> Any:
        out = super().pop(*args)
        definitions_changed()
        return out

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        definitions_changed()

    def setdefault(self, name: str, p: Pass) -> Pass:  # type: ignore[override]
        out = super().setdefault(name, p)
        definitions_changed()
        return out

    def popitem(self) -> tuple[str, Pass]:
        out = super().popitem()
        definitions_changed()
        return out

    def clear(self) -> None:
        super().clear()
        definitions_changed()


PASSES: dict[str, Pass] = PassRegistry({p.name: p for p in (
    canonicalize_exported, canonicalize_norm, canonicalize_gelu,
    fuse_sdpa, fuse_swiglu, fuse_shared_input_matmul, fuse_matmul_bias_act, fuse_attention_block, fuse_residual_ln,
    fuse_residual_rms_norm, fuse_transformer_layer, dead_code_elimination, mark_elementwise_regions, unfuse)})
"""Every pass by name (a `PassRegistry`)."""

STAGES: dict[str, Pass] = {st.name: st for p in PASSES.values() for st in p.stages}
"""Every stage of a pass by its step name (`fuse_sdpa/rope_heads`, `engine.Pass.stages`): a step of the trace that
`Pipeline.disable` switches off; not a pass of its own in a pass list."""

CANONICAL_ORDER = ("canonicalize_exported", "canonicalize_norm", "canonicalize_gelu",
                   "fuse_sdpa", "fuse_swiglu", "fuse_shared_input_matmul", "fuse_matmul_bias_act",
                   "fuse_attention_block", "fuse_residual_ln", "fuse_residual_rms_norm", "fuse_transformer_layer",
                   "dead_code_elimination", "mark_elementwise_regions", "dead_code_elimination")

RLX_ORDER = ("fuse_matmul_bias_act", "fuse_attention_block", "fuse_residual_ln", "fuse_residual_rms_norm",
             "fuse_transformer_layer", "fuse_swiglu", "fuse_shared_input_matmul", "mark_elementwise_regions",
             "dead_code_elimination")
"""RLX's newer order (docs/rlx.md §2.2) with our pass names (fuse_swiglu stands for both SwiGLU passes)."""

RLX_FAB_MAX_TOKENS = 64
"""RLX's batch*seq gate for attention-block fusion (`RLX_FUSE_ATTN_THRESHOLD` default, docs/rlx.md §2.3.2)."""

DEFAULT_PARAMS: dict[str, Any] = {k: getattr(PipelineParams(), k) for k in ("fab_max_tokens", "max_region_steps",
                                                                          "max_region_inputs", "merge_cost_test")}
"""The parameters every pipeline shows (`PipelineParams`' defaults; `unfuse_ops` only when given)."""


def _resolve(p: str | Pass) -> Pass:
    if isinstance(p, Pass):
        return p
    if p in STAGES:
        raise KeyError(f"[Pipeline] {p!r} is a step of the pass {family_of(p)!r}, not a pass: list {family_of(p)} "
                       f"(it runs every step) and switch the step off with disable({p!r})")
    if p not in PASSES:
        raise KeyError(f"[Pipeline] unknown pass {p!r}{close(str(p), PASSES)}; known: {', '.join(PASSES)}")
    return PASSES[p]


def _check_step(name: str) -> None:
    """Raises KeyError unless `name` is a pass or a stage of one (`STAGES`), naming the close matches."""
    if name not in PASSES and name not in STAGES:
        known = [*PASSES, *STAGES]
        raise KeyError(f"[Pipeline] unknown pass or step {name!r}{close(str(name), known)}; known: {', '.join(known)}")


@dataclass
class Pipeline:
    """An ordered list of passes with parameters.

    Args:
        passes: pass names or `Pass` objects, run in order (a pass may appear twice).
        params: overrides of `DEFAULT_PARAMS`; each key a `PipelineParams` field or a parameter a listed pass
            declares (`Pass.params`), else `ParamError`, a `KeyError` naming the close matches, here and wherever
            the params are read or run.
        name: shown in the trace.
        disabled: names skipped by `run` (kept in the list so the UI can re-enable them): passes, or stages of a
            pass (`fuse_sdpa/rope_heads`, `STAGES`); a pass switched off takes its stages with it. An unknown name
            raises `KeyError` here.

    Example:
        >>> from rlxviz.models import load_model
        >>> trace = Pipeline.canonical().run(load_model("bert-tiny", seq=8).graph)
        >>> trace.final.op_counts()["FusedTransformerLayer"]
        2
    """

    passes: list[str | Pass] = field(default_factory=lambda: list(CANONICAL_ORDER))
    params: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"
    disabled: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for name in self.disabled:
            self._check_step(name)
        check_params(self.params, f"pipeline {self.name!r}", self.known_params)

    def _check_step(self, name: str) -> None:
        """`_check_step`, also accepting the name of a `Pass` object the list holds (a pass of the author's own)."""
        if not any(isinstance(p, Pass) and p.name == name for p in self.passes):
            _check_step(name)

    @classmethod
    def of_steps(cls, names: Sequence[str], params: Mapping[str, Any] | None = None, name: str = "custom") -> Pipeline:
        """The pipeline whose run has the steps `names` (a trace's step names, in order): each stage name is folded
        into its pass (listed by its own step), and a listed pass's stages that are not among `names` are disabled.
        A name that is no pass is kept as it is (it fails where the pipeline resolves it, as in `Pipeline(names)`)."""
        listed = [n for n in names if n not in STAGES]
        off = {st.name for n in dict.fromkeys(listed) if n in PASSES for st in PASSES[n].stages if st.name not in names}
        return cls(listed, dict(params or {}), name, off)

    @property
    def known_params(self) -> tuple[str, ...]:
        """`PipelineParams`' fields and the parameters the listed passes declare (`Pass.params`)."""
        listed = [p if isinstance(p, Pass) else PASSES.get(p) for p in self.passes]  # unknown names fail elsewhere
        return tuple(dict.fromkeys((*PARAM_NAMES, *(k for p in listed if p is not None for k in p.params))))

    @classmethod
    def canonical(cls, **params: Any) -> Pipeline:
        """Our order (module docstring), no attention gate."""
        return cls(list(CANONICAL_ORDER), dict(params), "canonical")

    @classmethod
    def rlx(cls, **params: Any) -> Pipeline:
        """RLX's newer order and RLX's batch*seq gate of 64 (`fab_max_tokens`)."""
        return cls(list(RLX_ORDER), {"fab_max_tokens": RLX_FAB_MAX_TOKENS, **params}, "rlx")

    @classmethod
    def profile(cls, name: str, **params: Any) -> Pipeline:
        """`canonical` or `rlx`. Raises KeyError for other names."""
        if name not in ("canonical", "rlx"):
            raise KeyError(f"[Pipeline.profile] unknown profile {name!r}; known: canonical, rlx")
        return cls.canonical(**params) if name == "canonical" else cls.rlx(**params)

    @property
    def names(self) -> list[str]:
        return [_resolve(p).name for p in self.passes]

    @property
    def effective_params(self) -> dict[str, Any]:
        """`DEFAULT_PARAMS` with `params` over them. Raises `ParamError` for an unknown key (`params` is a mutable
        mapping: a key added after construction is checked here)."""
        return {**DEFAULT_PARAMS, **check_params(self.params, f"pipeline {self.name!r}", self.known_params)}

    def enable(self, name: str, at: int | None = None) -> Pipeline:
        """Re-enable `name` (a pass or a stage of one), or insert the pass (at index `at`, default the end) if
        absent."""
        if name in STAGES:
            self.disabled.discard(name)
            return self
        _resolve(name)
        self.disabled.discard(name)
        if name not in self.names:
            self.passes.insert(len(self.passes) if at is None else at, name)
        return self

    def disable(self, name: str) -> Pipeline:
        """Skip `name` when running (it stays in the list): a pass with its stages, or one stage of a pass
        (`fuse_sdpa/rope_heads`). Raises KeyError for an unknown name."""
        self._check_step(name)
        self.disabled.add(name)
        return self

    def reorder(self, names: Sequence[str]) -> Pipeline:
        """Replace the order with `names` (each must be a known pass)."""
        self.passes = [_resolve(n).name for n in names]
        return self

    def without(self, *names: str) -> Pipeline:
        """A copy with `names` removed from the list."""
        return Pipeline([p for p in self.passes if _resolve(p).name not in names], dict(self.params), self.name,
                        set(self.disabled))

    def active(self) -> list[Pass]:
        return [p for p in map(_resolve, self.passes) if p.name not in self.disabled]

    def steps(self) -> list[Pass]:
        """What `run` runs, one trace step each: every active pass, after its enabled stages (`Pass.stages`, each
        under its step name `PASS/STAGE`) and as its own rules alone (`Pass.own`)."""
        return [q for p in self.active() for q in (*(st for st in p.stages if st.name not in self.disabled), p.own)]

    def missing_requirements(self) -> list[tuple[str, str]]:
        """`(pass, required pass)` for every active pass whose `Pass.requires` names a pass that is not active
        in this pipeline (the pass would find none of the ops it matches). Order is not checked: a pass run
        before its prerequisites is a lesson the explanations teach, not a broken pipeline."""
        names = {p.name for p in self.active()}
        return [(p.name, r) for p in self.active() for r in p.requires if r not in names]

    def run(self, graph: Graph, params: Mapping[str, Any] | None = None) -> Trace:
        """Run the enabled passes in order, a pass's stages as steps of their own before it (`steps`); lint after
        each. A step that changed nothing hands back its input graph, the same object: graphs are immutable
        snapshots, so one already linted in this run is not linted again (most steps change nothing on a given
        model: 24 of 28 on granite.qdq, where each lint of its 3,826 nodes takes ~60 ms).

        A pass that raises, produces a graph the verifier rejects, or records a match or rejection naming a node of
        neither its input nor its output graph (`engine.check_records`) is recorded in its
        `PassStep.error` (prefixed with the pass name) and its result is discarded; the run goes on
        with the previous graph.

        Raises:
            ParamError: `params` (or `self.params`) names an unknown parameter; nothing runs.
        """
        p = {**self.effective_params, **check_params(params or {}, f"pipeline {self.name!r}", self.known_params)}
        trace = Trace(graph, [], self.name)
        g, linted = graph, None
        for ps in self.steps():
            t0 = time.perf_counter()
            try:
                res = ps(g, p)
                if res.graph is not linted:
                    lint(res.graph, stage=ps.name)
                    linted = res.graph
                check_records(g, res, ps.name)
                step = PassStep(ps.name, g, res.graph, res.matches, _in_run(trace, res.rejections), params=_used(p))
            except Exception as e:  # noqa: BLE001 - recorded in the trace, not raised
                step = PassStep(ps.name, g, g, [], [], error=f"{ps.name}: {type(e).__name__}: {e}", params=_used(p))
            step.seconds = time.perf_counter() - t0
            trace.steps.append(step)
            g = step.after
        return trace


def _in_run(trace: Trace, rejections: list[Rejection]) -> list[Rejection]:
    """`rejections` with what the run's earlier steps know added to their messages: a refused attention scale
    names the pre-scale / score-scale nodes `fuse_sdpa` folded into it (`attention.scale_origin`), and its fix line
    is the fold of the scale into the Q projection of the user's graph where one is known (`scale_fold.fold_hint`,
    the change the what-if `whatif.MODEL_WHAT_IFS["default_scale"]` applies and checks). A default scale applied to
    Q before its RoPE (ESM, `scale_blame.pre_rope_scale`) has nothing to change in the model: its fix line says so
    (and whether moving the mul by hand keeps the numbers exactly), its remedy is `compiler only` and its compiler fix
    `PRE_ROPE_SCALE_FIX`, so the refusal is a gap in rlxviz's ops in every layer (`why.policy.compiler_fix_only`)."""
    out = []
    for r in rejections:
        more = scale_origin(trace.steps, r)
        r = replace(r, message=r.message + more) if more else r
        pre = pre_rope_scale(trace.steps, r)
        if pre is not None:
            out.append(replace(r, hint=pre_rope_hint(*pre), remedy=COMPILER_ONLY, fix=PRE_ROPE_SCALE_FIX))
            continue
        fold = scale_fold(trace.input, trace.steps, r)
        out.append(replace(r, hint=fold_hint(trace.input, fold)) if fold is not None else r)
    return out


def _used(p: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if isinstance(v, int | float | str | bool | type(None) | list | tuple)}


def run_passes(graph: Graph, passes: Iterable[str | Pass], **params: Any) -> Trace:
    """Shorthand: `Pipeline(list(passes), params).run(graph)`."""
    return Pipeline(list(passes), dict(params)).run(graph)


def run_pass(graph: Graph, name: str | Pass, **params: Any) -> Graph:
    """Run one pass and return its graph (raises if the pass fails)."""
    trace = run_passes(graph, [name], **params)
    if trace.steps[0].error:
        raise RuntimeError(trace.steps[0].error)
    return trace.final


_LABELS: dict[str, dict[str, str]] = {}


def role_label(rule: str, role: str) -> str:
    """Role `role` of the rule named `rule` as messages name it (`guard.role_name` of the rule's `Rule.labels`):
    `ln1 (role h1)` for `fuse_transformer_layer.bert_post_ln`'s `ln1`; the role itself for a rule no registered pass
    holds. The drawings tag bound nodes with it, so a message's name is the drawn one (`viz.dot`)."""
    if not _LABELS:
        for p in PASSES.values():
            for r in (*p.rules, *(x for st in p.stages for x in st.rules)):
                _LABELS.setdefault(r.name, dict(r.labels))
    return role_name(role, _LABELS.get(rule, {}).get(role, role))


__all__ = ["CANONICAL_ORDER", "DEFAULT_PARAMS", "PASSES", "STAGES", "Pipeline", "RLX_ORDER", "role_label", "run_pass",
           "run_passes"]
