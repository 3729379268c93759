"""The teaching notebooks' helpers: the session's answers, plus HTML for Jupyter.

Everything that answers a question (loading a model, a pipeline, a layer's status, timing, the traffic a
fusion saves) is `rlxviz.session`, the same code the CLI and the app call; it is re-exported here so a
notebook needs one import. Running and timing go through the memory check `rlxviz run` / `rlxviz time` make
first (`Limits.check` with the `run` / `time` workload: `run_reference`, `time_versions`). What is added here
is presentation only: SVG wrapped for Jupyter so large graphs scroll instead of being clipped (`svg_html`,
`pair_html`, `show`, `show_step`).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import numpy as np

from .ir import Graph
from .passes.trace import PassStep, Trace
from .session import (
    OVER_THRESHOLD,
    RLX_THRESHOLD,
    FusionCheck,
    LayerStatus,
    Limits,
    SessionError,
    Traffic,
    VersionTiming,
    View,
    build_pipeline,
    check_fusion,
    format_timings,
    layer_status,
    load,
    model_layers,
    teaching_cases,
    traffic_saved,
)
from .session import time_versions as _time_versions
from .viz import Overlay

TeachError = SessionError
"""The notebooks' name for `session.SessionError` (one-line user errors)."""

TEACHING_CASES: dict[str, str] = teaching_cases()
"""Every teaching variant but `none`, with what it changes (from `models.VARIANTS`)."""


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None = None,
                  float_dtype: Any = None, limits: Limits | None = None) -> list[np.ndarray]:
    """`runtime.run_reference` (the NumPy executor: the graph's outputs in order), after the memory check
    `rlxviz run` makes: `Limits.check(graph, ..., "run")` (one run's live tensors and the outputs' copies).

    Args:
        limits: the memory limits (default `Limits.resolve()`).

    Raises:
        LimitError: the run would hold more than the limit (one line, nothing allocated); else what
            `runtime.run_reference` raises.
    """
    from .runtime.reference import run_reference as reference

    (limits or Limits.resolve()).check(graph, graph.name, "run")
    return reference(graph, feeds, weights, float_dtype)


def svg_html(svg: str, max_height: int = 560, caption: str = "") -> str:
    """SVG text wrapped in a scrolling `<div>` (large graphs scroll instead of being clipped)."""
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    cap = f'<div style="font:12px sans-serif;color:#444;margin:2px 0">{html.escape(caption)}</div>' if caption else ""
    return (f'{cap}<div class="rlxviz-graph" style="overflow:auto;max-height:{max_height}px;max-width:100%;'
            f'border:1px solid #ddd;padding:4px">{body}</div>')


def pair_html(left: str, right: str, max_height: int = 560, captions: tuple[str, str] = ("before", "after")) -> str:
    """Two SVG drawings side by side, each in its own scrolling box (narrow screens wrap them)."""
    cells = "".join(f'<div style="flex:1 1 420px;min-width:0">{svg_html(s, max_height, c)}</div>'
                    for s, c in zip((left, right), captions, strict=True))
    return f'<div style="display:flex;gap:8px;flex-wrap:wrap">{cells}</div>'


def show_step(step: PassStep, max_height: int = 560, view: str = "full", focus: int | None = None) -> Any:
    """A pass's before (matches clustered, rejections marked) and after (fused nodes marked) drawings, side by
    side, as an IPython HTML object: the session's drawings (`session.render`, as the app and `rlxviz render`
    make them) of `view` (`full` or `layers`), optionally only layer `focus`."""
    from IPython.display import HTML

    from .session import render as drawing

    trace = Trace(step.before, [step], step.pass_name)
    before, after = (drawing.svg(trace, View(1, view, side, focus)) for side in ("before", "after"))
    return HTML(pair_html(before, after, max_height, (f"before {step.pass_name}", f"after {step.pass_name}")))


def show(graph: Graph, overlay: Overlay | None = None, max_height: int = 560, caption: str = "", **kw: Any) -> Any:
    """The app's renderer (`viz.render_svg`) as an IPython HTML object for a notebook cell."""
    from IPython.display import HTML

    from .viz import render_svg

    return HTML(svg_html(render_svg(graph, overlay, **kw).svg, max_height, caption))


__all__ = ["OVER_THRESHOLD", "RLX_THRESHOLD", "TEACHING_CASES", "FusionCheck", "LayerStatus", "Limits", "TeachError",
           "Traffic", "VersionTiming", "build_pipeline", "check_fusion", "format_timings", "layer_status", "load",
           "model_layers", "pair_html", "run_reference", "show", "show_step", "svg_html", "time_versions",
           "traffic_saved",
           "expect_ints", "feedback"]


def feedback(check: Any, answer: Any) -> bool:
    """Run an exercise's `check(answer)` and print what is wrong, or that it is right.

    `check` raises `AssertionError` whose message tells the student what is wrong; it may return a
    short message for a right answer. Any other exception the check raises (a slip in the answer: a
    function that forgot to `return`, an IR typo, a value of the wrong type) is reported the same way,
    as one paragraph naming the exception's type and the first line of its message, never a traceback.
    Prints `not yet: <message>` or `correct: <message>`; returns whether the answer passed.
    """
    try:
        msg = check(answer)
    except AssertionError as e:
        print(f"not yet: {e}")
        return False
    except Exception as e:  # noqa: BLE001 - a student's slip, reported in plain words
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"not yet: checking your answer stopped with {type(e).__name__}" + (f": {first}" if first else "")
              + ". That is a slip in the answer, not in the check (a function that does not return its result, "
                "a typo, a value of the wrong type): fix the cell and run it again.")
        return False
    print(f"correct: {msg or 'well done'}")
    return True


def expect_ints(answer: Any, names: tuple[str, ...]) -> tuple[int, ...]:
    """`answer` as a tuple of whole numbers, one per name in `names`, or an `AssertionError` whose message says
    what shape the answer must have (for an exercise check, shown by `feedback`). None means not filled in."""
    import numbers

    want = "(" + ", ".join(names) + ")"
    if not isinstance(answer, (tuple, list)):
        raise AssertionError(f"give a tuple of {len(names)} numbers, {want}; you gave a single "
                             f"{type(answer).__name__} ({answer!r})")
    if len(answer) != len(names):
        raise AssertionError(f"give a tuple of {len(names)} numbers, {want}; yours has {len(answer)}")
    if any(v is None for v in answer):
        raise AssertionError("fill in " + ("both numbers" if len(names) == 2 else "every number"))
    for name, v in zip(names, answer, strict=True):
        if isinstance(v, str):
            raise AssertionError(f"{name}: {v!r} is text (in quotes); write the number without quotes")
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise AssertionError(f"{name}: give a whole number, not a {type(v).__name__} ({v!r})")
        if not isinstance(v, numbers.Integral) and not float(v).is_integer():
            raise AssertionError(f"{name}: {v!r} is not a whole number; counts of bytes and launches are")
    return tuple(int(v) for v in answer)


def roofline_svg(gflops: float, gbps: float, points: list[tuple[str, float, float]], width: int = 560,
                 height: int = 360) -> str:
    """A log-log roofline as SVG text: the ceiling `min(gflops, intensity * gbps)` and one dot per point.

    Args:
        gflops / gbps: the measured compute (1e9 FLOP/s) and bandwidth (1e9 B/s) ceilings.
        points: `(label, intensity FLOP/B, achieved 1e9 FLOP/s)` per measured version.

    Raises:
        ValueError: a ceiling or a point that is not positive (a log axis has no place for it).
    """
    import math

    if gflops <= 0 or gbps <= 0 or any(i <= 0 or f <= 0 for _, i, f in points):
        raise ValueError("[roofline_svg] ceilings and points must be positive")
    ridge = gflops / gbps
    xs = [ridge, *(i for _, i, _ in points)]
    ys = [gflops, *(f for _, _, f in points)]
    x0, x1 = math.log10(min(xs) / 10), math.log10(max(xs) * 10)
    y0, y1 = math.log10(min(min(ys), min(xs) / 10 * gbps) / 2), math.log10(gflops * 2)
    pad = 48

    def px(i: float) -> float:
        return pad + (math.log10(i) - x0) / (x1 - x0) * (width - 2 * pad)

    def py(f: float) -> float:
        return height - pad - (math.log10(f) - y0) / (y1 - y0) * (height - 2 * pad)

    lo = 10 ** x0
    roof = f"{px(lo):.1f},{py(lo * gbps):.1f} {px(ridge):.1f},{py(gflops):.1f} {px(10 ** x1):.1f},{py(gflops):.1f}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="11">',
             f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" fill="none" '
             'stroke="#999"/>',
             f'<polyline points="{roof}" fill="none" stroke="#333" stroke-width="2"/>',
             f'<text x="{px(ridge) + 4:.1f}" y="{py(gflops) - 6:.1f}">ridge {ridge:.1f} FLOP/B; peak {gflops:.1f} '
             'GFLOP/s</text>',
             f'<text x="{width / 2:.0f}" y="{height - 12}" text-anchor="middle">arithmetic intensity '
             '(FLOP/B, log)</text>',
             f'<text x="14" y="{height / 2:.0f}" transform="rotate(-90 14 {height / 2:.0f})" text-anchor="middle">'
             'achieved GFLOP/s (log)</text>']
    for k, (label, i, f) in enumerate(points):
        parts.append(f'<circle cx="{px(i):.1f}" cy="{py(f):.1f}" r="4" fill="#c33"/>')
        parts.append(f'<text x="{px(i) + 6:.1f}" y="{py(f) + 4 + 12 * (k % 3 - 1):.1f}">#{k} '
                     f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def check_memory(graph: Graph, source: str, workload: str, limits: Limits | None = None) -> str:
    """The memory check the CLI and the app make before a command (`Limits.check`, `ir.memory.workload_peak`):
    one line naming the workload's estimated peak and the limit, or `LimitError` (a `TeachError`, one line).

    Args:
        graph: the graph the command runs (for `time`: the unfused version 0).
        source: what it came from, named in a refusal. workload: `load`, `run`, `run-mlx` or `time`.
        limits: default `Limits.resolve()` (`$RLXVIZ_MAX_MEMORY_MB`, else 2048 MiB), as the CLI resolves them.
    """
    from .session import human_bytes

    limits = limits or Limits.resolve()
    need = limits.check(graph, source, workload)
    return f"memory check ({workload}): estimated peak {human_bytes(need)} of the {human_bytes(limits.max_bytes)} " \
           f"limit ({limits.source})"


def time_versions(trace: Trace, feeds: Any, weights: Any, *args: Any, source: str = "the notebook's model",
                  limits: Limits | None = None, **kw: Any) -> list[VersionTiming]:
    """`session.time_versions`, after the memory check `rlxviz time` makes (`check_memory(..., "time")`: the
    float64 oracle, the battery and the MLX copies counted), so a notebook is refused as the CLI is, in one line,
    before anything is allocated. Arguments as `session.time_versions`."""
    check_memory(trace.input, source, "time", limits)
    return _time_versions(trace, feeds, weights, *args, **kw)


__all__ += ["check_memory", "roofline_svg"]
