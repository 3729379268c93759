"""Weight statistics for the node panel (`session.tensors.summarize`, `app.explain.node_weights`): exact on small
tensors, a bounded sample on big ones, NaN counted apart, and a weight's name shown as text."""

import re

import numpy as np
import pytest

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.session.tensors import FIRST_VALUES, summarize


def test_small_tensor_statistics_are_exact():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    s = summarize(a)
    assert (s.shape, s.dtype, s.size, s.read) == ((3, 4), "float32", 12, 12)
    assert (s.min, s.max) == (-5.5, 5.5) and s.mean == pytest.approx(0.0) and s.std == pytest.approx(a.std())
    assert s.first == tuple(float(x) for x in a.reshape(-1)[:FIRST_VALUES]) and s.nonfinite == 0
    text = "\n".join(s.lines())
    assert "float32[3, 4], 12 elements" in text and "min -5.5, max 5.5" in text and text.endswith(", ...")
    assert "sample" not in text


def test_big_tensor_reads_a_bounded_sample():
    a = np.linspace(-1.0, 3.0, 1_000_003, dtype=np.float32)
    s = summarize(a, limit=1000)
    assert s.size == 1_000_003 and s.read <= 1000 and s.read >= 900
    assert s.min == -1.0 and 2.9 < s.max <= 3.0 and abs(s.mean - 1.0) < 0.01
    assert "evenly spaced sample of" in s.lines()[1]
    strided = np.ones((2000, 3000), np.float16)[:, ::3]  # not contiguous
    assert summarize(strided, limit=500).read <= 500


def test_nan_ints_bools_and_scalars():
    s = summarize(np.array([1.0, np.nan, np.inf, -2.0]))
    assert s.nonfinite == 2 and (s.min, s.max) == (-2.0, 1.0) and "2 NaN or infinite" in "\n".join(s.lines())
    assert summarize(np.array([np.nan])).min is None
    i = summarize(np.array([[3, -7]], dtype=np.int64))
    assert (i.min, i.max, i.first) == (-7.0, 3.0, (3, -7))
    b = summarize(np.array([True, False, True]))
    assert b.mean == pytest.approx(2 / 3) and b.first == (True, False, True)
    z = summarize(np.float32(2.5))
    assert z.shape == () and z.size == 1 and z.first == (2.5,)
    with pytest.raises(ValueError, match="limit"):
        summarize(np.zeros(3), limit=0)


def test_node_panel_shows_the_weights_of_a_param_and_of_its_users():
    from test_app_views import tiny

    s = tiny()
    g = s.model.graph
    p = next(n for n in g if n.op is Op.PARAM and len(s.model.weights[n.attrs["name"]].shape) == 2)
    w = s.model.weights[p.attrs["name"]]
    text = report_markdown(node_report(g, p.id, s.trace, s.model.weights))
    assert "**weights**" in text and f"{w.size:,} elements" in text and f"max {float(w.max()):.4g}" in text
    user = g.users(p)[0]
    assert p.attrs["name"] in [name for name, _ in node_report(g, user.id, s.trace, s.model.weights)["weights"]]
    assert "**weights**" not in report_markdown(node_report(g, p.id, s.trace))  # no weights given: none shown


def test_a_weight_name_from_the_model_is_text():
    from rlxviz.ir import parse_ir

    g = parse_ir('graph g {\n  %0 = param {name="<img src=x onerror=alert(1)>"} : f32[2]\n'
                 '  %1 = neg(%0) : f32[2]\n  return %1\n}\n')
    weights = {"<img src=x onerror=alert(1)>": np.array([1.0, -1.0], np.float32)}
    text = report_markdown(node_report(g, 1, None, weights))
    assert re.search(r"(?<!\\)<img", text) is None and "\\<img" in text and "min -1" in text


def test_a_node_with_more_weights_than_shown_says_how_many_and_names_the_rest():
    """A newcomer's FusedTransformerLayer (12 weights): the panel listed 4 under "weights" with no word of the other
    8. The panel summarizes at most `WEIGHTS_SHOWN` and says "4 of 12", naming every one it left out."""
    from test_app_views import tiny

    from rlxviz.app.explain import WEIGHTS_SHOWN, weight_names
    from rlxviz.app.text import md_code
    from rlxviz.ir.ops import FUSED

    s = tiny()
    g = s.trace.final
    n = next(n for n in g if n.op in FUSED and len(weight_names(g, n, s.model.weights)) > WEIGHTS_SHOWN)
    held = weight_names(g, n, s.model.weights)
    rep = node_report(g, n.id, s.trace, s.model.weights)
    assert rep["weights_held"] == held and len(rep["weights"]) == WEIGHTS_SHOWN
    text = report_markdown(rep)
    assert f"{WEIGHTS_SHOWN} of {len(held)} summarized" in text, text
    left = text[text.index(f"{WEIGHTS_SHOWN} of {len(held)}"):]
    assert all(md_code(name) in left for name in held[WEIGHTS_SHOWN:]), left
    assert all(md_code(name) not in left for name in held[:WEIGHTS_SHOWN])
    p = next(n for n in g if n.op is Op.PARAM)  # a node holding one weight: no such line
    assert " summarized (" not in report_markdown(node_report(g, p.id, s.trace, s.model.weights))
