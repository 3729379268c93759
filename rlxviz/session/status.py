"""Layer status: did layer N fuse as its architecture expects, and if not, why. The session's door to the one verdict
(`passes.why.RunVerdict`): `check_fusion` and `layer_status` return it (or one layer of it), turning a bad request
into a `SessionError`; the deciding lives in `passes/why/`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..passes import Trace
from ..passes.why.facts import RunFacts, recognized
from ..passes.why.places import with_standings
from ..passes.why.policy import EXPECT_MODES, PRODUCTS, layer_pass
from ..passes.why.verdict import (
    FusionCheck,
    LayerStatus,
    RunVerdict,
    expected_misses,
    judged_kind,
    layer_verdict,
    verdict_pass,
)
from .errors import SessionError
from .loading import model_layers


def _expect(expect: str) -> None:
    if expect not in EXPECT_MODES:
        raise SessionError(f"expect {expect!r}: use one of {', '.join(EXPECT_MODES)}")


def layer_status(trace: Trace, layer: int, expect: str = "model") -> LayerStatus:
    """The verdict on `layer` in a pipeline run, judged against `expect` (`EXPECT_MODES`; `passes.why.verdict`).

    Raises:
        SessionError: `expect` is not one of `EXPECT_MODES`.
    """
    _expect(expect)
    return layer_verdict(trace, layer, expect)


def check_layer(trace: Trace, layer: int, model: str = "") -> None:
    """Raise `SessionError` unless `layer` is a layer of the run's input graph (the message gives the span)."""
    have = model_layers(trace.input)
    if layer not in have:
        span = f"{have[0]}..{have[-1]}" if have else "none: no node path names a layer"
        raise SessionError(f"layer {layer} is not in {model or 'the model'} (layers: {span})")


def check_fusion(trace: Trace, model: str = "", layers: Iterable[int] | None = None,
                 expect: str = "model") -> FusionCheck:
    """The run's verdict (`RunVerdict.of`) on every layer (or on `layers`), judged against `expect`, with each
    rejected outcome's standing (`places.with_standings`: `explain -v`'s and the Why tab's per-rule tags).

    Raises:
        SessionError: a requested layer is not in the model (the message gives the layers it has), or `expect` is
            not one of `EXPECT_MODES`.
    """
    _expect(expect)
    try:
        return with_standings(trace, RunVerdict.of(trace, expect, None if layers is None else list(layers), model))
    except ValueError as e:
        raise SessionError(str(e)) from None


def reference_run(trace: Trace) -> Trace | None:
    """The canonical pipeline's run on the run's input graph, or None when the run ran every canonical pass."""
    return RunFacts.of(trace).reference()


def pipeline_cannot_make(trace: Trace, layer: int | None) -> list[str]:
    """What the run's pipeline cannot make in `layer` (None: the whole graph) that is legal there."""
    return RunFacts.of(trace).cannot_make(layer)


__all__ = ["EXPECT_MODES", "PRODUCTS", "FusionCheck", "LayerStatus", "check_fusion", "check_layer",
           "expected_misses", "judged_kind", "layer_pass", "layer_status", "pipeline_cannot_make", "recognized",
           "reference_run", "verdict_pass"]
