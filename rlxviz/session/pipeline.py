"""Building and running pipelines for every front end: one builder (with `Pass.requires` checked), one
cache of traces keyed by content, and version lookup by pass name.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ..ir import Graph
from ..passes import PASSES, Pipeline, Trace
from ..passes.params import ParamError, check_params
from ..passes.pipeline import STAGES
from ..passes.spelling import close
from ..passes.trace import family_of
from .cache import LRUCache
from .errors import PipelineError

PROFILES = ("canonical", "rlx")
"""Named pipelines (`Pipeline.profile`)."""

TRACES = LRUCache(maxsize=16)
"""Pipeline runs by (input graph digest, passes, params), shared by every session of the process."""


def pipeline_name(names: Sequence[str]) -> str:
    """The name a pipeline of the passes `names` (in order; steps to switch off left out) goes by: a profile's
    (`PROFILES`) when they are that profile's passes and it sets no parameter of its own (`canonical`: the app's
    default list is the canonical pipeline, as `explain` names it), else `custom`. One name for the same passes in
    every front end (the app's Why tab said "app pipeline" where `explain` said "canonical pipeline")."""
    for profile in PROFILES:
        pipe = Pipeline.profile(profile)
        if not pipe.params and list(names) == pipe.names:
            return profile
    return "custom"


def check_requirements(pipe: Pipeline) -> Pipeline:
    """`pipe`, after checking that every active pass's `Pass.requires` is active too.

    Raises:
        PipelineError: names the pass and the missing pass it requires.
    """
    missing = pipe.missing_requirements()
    if missing:
        p, r = missing[0]
        raise PipelineError(f"{p} requires {r} (it matches what {r} produces), which is not in the pipeline; "
                            f"add or enable {r}, or remove {p}")
    return pipe


def build_pipeline(spec: str | Sequence[str] = "canonical", params: Mapping[str, Any] | None = None,
                   name: str | None = None) -> Pipeline:
    """A checked pipeline from a profile name (`canonical`, `rlx`) or pass names (a list, or one
    comma-separated string; an empty list runs no pass), with `params` over the profile's. An entry `-STEP` switches
    a pass or a step of one off (`canonical,-fuse_sdpa/rope_heads`: the canonical profile without that stage of
    `fuse_sdpa`, `Pipeline.disable`); a profile may lead such a list. A list may name a listed pass's steps (the
    app's rows): then that pass runs the steps named and no other (a list naming none of them runs them all).

    Raises:
        PipelineError: an unknown pass or step (the message lists the known ones and names the close matches), an
            unknown parameter (it names the close matches: `{"fab_max_tokns": 1}` would otherwise switch the
            attention gate off), an empty list, or a pass whose required pass is missing (`check_requirements`).
    """
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    off = [n[1:].strip() for n in names if n.startswith("-")]
    names = [n for n in names if not n.startswith("-")]
    if isinstance(spec, str) and names[:1] and names[0] in PROFILES and (len(names) == 1 or off):
        pipe = Pipeline.profile(names[0])
        names = names[1:]
        if names:
            raise PipelineError(f"a profile ({pipe.name}) takes only steps to switch off (-STEP) after it, not "
                                f"{names[0]!r}")
    else:
        if not names and isinstance(spec, str):  # a list may be empty: every pass switched off
            raise PipelineError("empty pipeline: give a profile (canonical, rlx) or pass names separated by commas")
        stages = [n for n in names if n in STAGES]
        unknown = [n for n in names if n not in PASSES and n not in STAGES]
        if unknown:
            raise PipelineError(f"unknown pass {unknown[0]!r}{close(unknown[0], PASSES)}; known: {', '.join(PASSES)} "
                                "(or a profile: canonical, rlx)")
        orphan = next((n for n in stages if family_of(n) not in names), None)
        if orphan is not None:
            raise PipelineError(f"{orphan!r} is a step of the pass {family_of(orphan)!r}, which the list does not "
                                f"hold: list {family_of(orphan)} (it runs every step), and -{orphan} to switch one off")
        pipe = Pipeline([n for n in names if n not in STAGES], {}, name or pipeline_name(names))
        for fam in dict.fromkeys(map(family_of, stages)):  # a list naming some steps of a pass runs those only
            for st in PASSES[fam].stages:
                if st.name not in stages:
                    pipe.disable(st.name)
    for n in off:
        if n not in PASSES and n not in STAGES:
            raise PipelineError(f"unknown pass or step {n!r} to switch off{close(n, [*PASSES, *STAGES])}; known: "
                                f"{', '.join([*PASSES, *STAGES])}")
        pipe.disable(n)
    try:
        check_params(params or {}, known=pipe.known_params)
    except ParamError as e:
        raise PipelineError(str(e)) from None
    pipe.params.update(params or {})
    return check_requirements(pipe)


def graph_digest(graph: Graph) -> str:
    """`graph.digest` (`Graph.digest`: its IR text and the values it carries), the name older callers use."""
    return graph.digest


def run_pipeline(graph: Graph, pipe: Pipeline) -> Trace:
    """`pipe.run(graph)`, cached per (graph content, step order: a stage switched off is another run, effective
    params)."""
    key = ("trace", graph.digest, tuple(p.name for p in pipe.steps()),
           tuple(sorted((k, repr(v)) for k, v in pipe.effective_params.items())), pipe.name)
    return TRACES.get_or_compute(key, lambda: pipe.run(graph))


def _rule_entries(p: Any) -> list[dict[str, Any]]:
    return [{"name": r.name, "doc": r.doc, "guards": r.guard_names, "guard_kinds": r.guard_kinds} for r in p.rules]


def pass_catalog(pipe: Pipeline | None = None) -> list[dict[str, Any]]:
    """Each pass of `pipe` (default canonical), in order: name, doc, requires, and its rules with their
    docs, guard names (structure steps and guards, in the order they run) and each guard's kind of "no"; `stages`:
    the steps that run before its own rules (`fuse_sdpa/rope_heads`, ...), each with its doc, its rules and whether
    the pipeline switched it off."""
    pipe = pipe or Pipeline.canonical()
    return [{"name": p.name, "doc": p.doc, "requires": list(p.requires), "rules": _rule_entries(p),
             "stages": [{"name": st.name, "doc": st.doc, "off": st.name in pipe.disabled, "rules": _rule_entries(st)}
                        for st in p.stages]}
            for p in pipe.active()]


def format_passes(pipeline: Pipeline | None = None) -> str:
    """`pass_catalog` as text: one block per pass, one line per rule, its guards wrapped below; a pass's stages first,
    each on a `step` line with its rules below it."""
    pipe = pipeline or Pipeline.canonical()
    params = {k: v for k, v in pipe.effective_params.items()}
    lines = [f"{pipe.name} pipeline ({len(pipe.active())} passes; params: "
             + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"]

    def rules(entries: list[dict[str, Any]], indent: int) -> None:
        for r in entries:
            lines.append(" " * indent + r["name"] + (f": {r['doc']}" if r["doc"] else ""))
            lines.extend(textwrap.wrap("guards: " + ", ".join(r["guards"]), 110, initial_indent=" " * (indent + 4),
                                       subsequent_indent=" " * (indent + 4), break_on_hyphens=False))

    for i, p in enumerate(pass_catalog(pipe), 1):
        req = f"  [after: {', '.join(p['requires'])}]" if p["requires"] else ""
        lines.append(f"{i:2d}. {p['name']}: {p['doc']}{req}")
        for st in p["stages"]:
            lines.append(f"      step {st['name']}: {st['doc']}" + (" [switched off]" if st["off"] else ""))
            rules(st["rules"], 10)
        if not p["rules"]:
            lines.append("      (no patterns: a graph-wide pass)")
        rules(p["rules"], 6)
    return "\n".join(lines)


def version_index(trace: Trace, after: str) -> int:
    """Index into `trace.versions()` for `after`: `input`, `final`, a pass name (its first run; for a pass with
    stages, its own step, the last of them), a stage's step name (`fuse_sdpa/rope_heads`), or `NAME#K` (its K-th run,
    1-based).

    Raises:
        PipelineError: an unknown pass, or one that did not run (the message lists those that did).
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
    if name not in PASSES and name not in STAGES:
        raise PipelineError(f"unknown pass {name!r}{close(name, [*PASSES, *STAGES])}; known: {', '.join(PASSES)} "
                            f"(or input, final, or a step of a pass: {', '.join(STAGES)})")
    if not runs or not 1 <= nth <= len(runs):
        ran = ", ".join(dict.fromkeys(s.pass_name for s in trace.steps))
        what = f"run {nth} of {name!r}" if runs else f"pass {name!r}"
        raise PipelineError(f"{what} is not in this pipeline; it ran: {ran}")
    return runs[nth - 1]


__all__ = ["PROFILES", "TRACES", "build_pipeline", "check_requirements", "format_passes", "graph_digest",
           "pass_catalog", "pipeline_name", "run_pipeline", "version_index"]
