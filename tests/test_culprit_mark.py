"""The culprit mark sits on the extra reader, and a ○ place is not framed as rejected (newcomer report): n4-15 in the
collapsed view marked "offending: sum_single_user" on `layer_norm` %42, the norm the fusion would absorb, beside the
real extra reader `mul` %43, and framed the layer red and dashed "rejected: sum_single_user" while the caption and
chip said ○1 not near-miss. The reader guards (`single_user`, `user_count`) now mark the users outside the match
only, and the layer view draws a layer whose every refusal is no near-miss grey and dotted (`NOT_NEAR_MISS`)."""

from __future__ import annotations

import functools

import pytest
from test_why_reader_advice import variant

from rlxviz import session
from rlxviz.viz.layers import layers_to_dot
from rlxviz.viz.overlay import Overlay
from rlxviz.viz.styles import NOT_NEAR_MISS, REJECT

# n4-15 as shipped (probe mul %43 of the sum %39); the probe moved to h1 (%42); the sum read by a returned probe
CASES = {"n4-15": None, "n4-15 reader returned": dict(reader_of="%39", reader_returned=True),
         "n4-15 h1 reader": dict(reader_of="%42", reader_returned=True)}


@functools.cache
def _trace(name: str):
    from pathlib import Path

    kw = CASES[name]
    text = (Path(__file__).parent / "data" / "cases" / "n4-15-residual-logged.rlx").read_text() if kw is None \
        else variant(**kw)
    m = session.load_ir_text(text)
    return session.run_pipeline(m.graph, session.build_pipeline())


@pytest.mark.parametrize("name", CASES)
def test_only_the_extra_readers_are_offending(name):
    trace = _trace(name)
    reader_guards = [(s, r) for s in trace.steps for r in s.rejections if r.guard.endswith(("_single_user",
                                                                                             "_user_count"))]
    assert reader_guards, name
    for s, r in reader_guards:
        g = s.before
        fused_into = {r.anchor}  # the norm (or layer) the fusion anchors at never reads as the culprit
        assert r.offending and not fused_into & set(r.offending), (r.rule, r.guard, r.offending)
        for u in r.offending:
            assert g[u].op.value != "layer_norm", (r.rule, r.guard, g[u])
        assert {b for _, b in r.offending_edges} == set(r.offending)


def test_n4_15s_probe_mul_is_the_one_culprit():
    trace = _trace("n4-15")
    s = next(s for s in trace.steps if s.pass_name == "fuse_residual_ln")
    (r,) = [r for r in s.rejections if r.guard == "sum_single_user"]
    assert [s.before[u].op.value for u in r.offending] == ["mul"]


@pytest.mark.parametrize("name", ["n4-15", "n4-15 reader returned"])
def test_a_not_near_miss_layer_is_framed_grey_not_rejected(name):
    trace = _trace(name)
    s = next(s for s in trace.steps if s.pass_name == "fuse_residual_ln")
    ov = Overlay.before(s).worded_by(trace, s)
    assert "0 rejected places" in ov.title and "○1" in ov.title
    box = next(ln for ln in layers_to_dot(s.before, ov).splitlines() if ln.strip().startswith("layer0 "))
    assert NOT_NEAR_MISS in box and "rejected:" not in box and REJECT not in box and "dashed" not in box, box


def test_a_near_miss_layer_is_still_framed_rejected():
    """bert-tiny's dead_h1_user: h1 read by a dead probe in a post-LN layer, a near-miss: red, dashed."""
    from test_app_views import tiny

    trace = tiny(variant="dead_h1_user").trace
    s = next(s for s in trace.steps if s.pass_name == "fuse_transformer_layer")
    ov = Overlay.before(s).worded_by(trace, s)
    assert "1 rejected place" in ov.title
    box = next(ln for ln in layers_to_dot(s.before, ov).splitlines() if ln.strip().startswith("layer0 "))
    assert "rejected:" in box and REJECT in box and NOT_NEAR_MISS not in box, box
