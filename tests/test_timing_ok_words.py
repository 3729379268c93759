"""Timing wording a newcomer found: the max-error dots were red for every version, ok or not (now coloured by the
table's verdict), and "ok" had no scale (now one line, `PrecisionPolicy.ok_rule`, says the tolerance it is judged
against, in `rlxviz time`'s text and `--json` and in the app's Timing tab)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.timingchart import FASTER_COLOR, NEUTRAL_COLOR, SLOWER_COLOR, error_color, timing_figure
from rlxviz.ir import DType
from rlxviz.runtime.precision import Judge, precision_policy

CASE = Path(__file__).parent / "data" / "cases" / "n4-15-residual-logged.rlx"


def row(verdict: str | None, err: float = 1e-6) -> dict:
    r = {"version": "v", "median_ms": 1.0, "max_err": err, "speedup": 1.0, "vs_input": "", "busy": ""}
    return r if verdict is None else {**r, "verdict": verdict}


@pytest.mark.parametrize("verdict, colour", [("ok", FASTER_COLOR), ("unchanged", FASTER_COLOR),
                                             ("fusion changed the numbers on random (...)", SLOWER_COLOR),
                                             ("precision", SLOWER_COLOR), (None, NEUTRAL_COLOR)])
def test_an_error_dot_is_coloured_by_the_verdict_not_its_size(verdict, colour):
    assert error_color(row(verdict)) == colour
    assert error_color(row(verdict, err=1e-1)) == colour  # a large error the table calls ok stays green


def test_the_chart_draws_each_dot_in_its_verdicts_colour():
    fig = timing_figure([row("ok"), row("ok", 2e-6), row("fusion changed the numbers", 0.3)])
    from bokeh.models import GlyphRenderer

    (dots,) = [r for r in fig.select({"type": GlyphRenderer}) if getattr(r.glyph, "x", None) == "err"]
    colour = dots.glyph.fill_color  # a field of the source (a dict or a `field` spec, by Bokeh's version)
    assert getattr(colour, "field", colour.get("field") if isinstance(colour, dict) else colour) == "err_color"
    assert dots.data_source.data["err_color"] == [FASTER_COLOR, FASTER_COLOR, SLOWER_COLOR]


@pytest.mark.parametrize("dtype, device, bound", [(DType.f32, "cpu", "0.0001 + 0.001 x |want|"),
                                                  (DType.f16, "cpu", "0.01 + 0.01 x |want|"),
                                                  (DType.f32, "cuda+tf32", "0.02 + 0.02 x |want|")])
def test_ok_rule_states_the_tolerance_in_force(dtype, device, bound):
    p = precision_policy(dtype, device)
    assert p.ok_rule().startswith(f"ok: every output element within {bound} of the float64 oracle"), p.ok_rule()
    assert '"vs oracle" is the largest |error|' in p.ok_rule()


def test_ok_rule_of_a_quantized_graph_names_version_0_and_its_tolerance():
    from dataclasses import replace

    p = replace(precision_policy(DType.f32, "cpu"), judge=Judge(2, "%5 cast u8[4]"))
    rule = p.ok_rule()
    assert f"within {p.same_backend.atol:g} + {p.same_backend.rtol:g} x |want| of version 0 in f32" in rule, rule
    assert '"vs input"' in rule and "oracle" not in rule


def test_rlxviz_time_says_what_ok_is_judged_against(capsys):
    code, text, err = cli_run(capsys, "time", CASE, "--repeat", "1", "--warmup", "0")
    assert code == 0 and "Traceback" not in err, err
    policy = precision_policy(DType.f32, "cpu").ok_rule()
    lines = text.splitlines()
    assert policy in lines and lines[lines.index(policy) - 1].startswith("precision: "), text
    jcode, out, _ = cli_run(capsys, "time", CASE, "--repeat", "1", "--warmup", "0", "--json")
    assert jcode == code and json.loads(out)["ok_rule"] == policy


def test_the_timing_tab_says_it_in_the_same_words():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", batch=1, seq=8, repeat=1, warmup=0)
    s.time_all()
    assert "ok: every output element within 0.0001 + 0.001 x" in s.timing_policy.replace("\\", ""), s.timing_policy
