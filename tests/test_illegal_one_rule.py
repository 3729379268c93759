"""One rule for a refusal illegal for its layer (newcomer run 11): an `illegal` refusal whose value the model's outputs
read (`read by the model`: no change to the model that keeps its numbers makes the product legal) leaves the layer
"fused as far as legal", whatever rule refused and whichever value the reader touches. A probe of the residual sum
(n4-15) and a later layer reading K (n4-13) were that, while a probe of h1 (`--variant extra_h1_user`, a sibling layer
fused) was a near-miss, exit 1, with the same "fix: none in the model" line. A dead reader (DCE, a checked fix in
the model) stays a near-miss (`dead_h1_user`, the start strip's ②).

And a layer NOT fused says what was made beside what was missed (n4-09, n4-06 listed nothing that fused; both are
now gaps in rlxviz's ops, so a dead reader and a pre-LN layer show it), and a refusal's remedy agrees with its fix
(n4-09 had `"remedy": "in the model"` beside "nothing to change in the model")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run

from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import COMPILER_ONLY, NOTHING_TO_CHANGE
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.verdict import ILLEGAL_HERE_GROUP, RunVerdict

CASES = Path(__file__).parent / "data" / "cases"


def _ir(capsys, tmp_path: Path, variant: str, layer: int) -> Path:
    """`rlxviz ir bert-tiny --variant VARIANT --variant-layer LAYER` written to a file, as the newcomer did."""
    code, out, _ = run(capsys, "ir", "bert-tiny", "--seq", 8, "--variant", variant, "--variant-layer", layer)
    assert code == 0
    path = tmp_path / f"bt-{variant}-{layer}.ir"
    path.write_text(out)
    return path


def _source(capsys, tmp_path: Path, name: str) -> tuple[Path, int]:
    """(IR file, the layer that holds the illegal refusal) of a case."""
    if name.startswith("bt:"):
        variant, layer = name[3:].split("@")
        return _ir(capsys, tmp_path, variant, int(layer)), int(layer)
    return CASES / name, 0


@pytest.mark.parametrize("name", ["n4-15-residual-logged.rlx", "n4-13-cross-layer-kv-sharing.rlx",
                                  "bt:extra_h1_user@1", "bt:output_intermediate@0"])
def test_a_refusal_read_by_the_model_leaves_the_layer_fused_as_far_as_legal(capsys, tmp_path, name):
    path, layer = _source(capsys, tmp_path, name)
    code, out, _ = run(capsys, "explain", path)
    assert code == 0, out
    assert f"layer {layer}: fused as far as legal: " in out and "only as far as legal" in out, out
    assert "fix: none in the model: " in out and "NOT fused" not in out, out
    code, out, _ = run(capsys, "explain", path, "--json")
    d = json.loads(out)
    assert code == 0 and d["ok"] is True
    v = next(x for x in d["layers"] if x["layer"] == layer)
    assert v["status"] == "fused as far as legal" and v["illegal"], v["status"]
    assert all(o["kind"] == "illegal" and o["remedy"] == "read by the model" for o in v["illegal"])
    # the chips' reading of each such place: ○ illegal here, never a near-miss ✗
    trace = Pipeline.canonical().run(parse_ir(path.read_text()))
    illegal = {(o.rule, o.nodes[0]) for o in RunVerdict.of(trace).layer(layer).illegal}
    rejections = [r for s in trace.steps for r in s.rejections if (r.rule, r.anchor) in illegal]
    assert rejections and all((standing(trace, r) or ("",))[0] == ILLEGAL_HERE_GROUP for r in rejections)


def test_a_dead_reader_stays_a_near_miss(capsys, tmp_path):
    """The same probe of h1, read by nothing: dead-code elimination is a fix in the model, so the layer is NOT fused
    (exit 1) and its refusal counts (the start strip's ② applies this variant)."""
    from rlxviz.app.start import BREAK_VARIANT

    assert BREAK_VARIANT == "dead_h1_user"
    path = _ir(capsys, tmp_path, "dead_h1_user", 1)
    code, out, _ = run(capsys, "explain", path)
    assert code == 1 and "layer 1: NOT fused (expected FusedTransformerLayer)" in out, out
    assert "guard h1_user_count" in out and "dead_code_elimination run on the model removes it" in out, out
    trace = Pipeline.canonical().run(parse_ir(path.read_text()))
    first = RunVerdict.of(trace).layer(1).first
    r = next(r for s in trace.steps for r in s.rejections if (r.rule, r.guard) == (first.rule, first.guard))
    assert standing(trace, r) is None  # a near-miss: the chips' ✗


@pytest.mark.parametrize("variant, made, missed", [
    # n4-09's dequant scale and n4-06's DeepNorm residual are gaps in rlxviz's ops (`test_compiler_only_gap`): no
    # longer NOT fused; a dead reader of h1 and a pre-LN layer among post-LN siblings are
    ("dead_h1_user", ["FusedMatMulBiasAct %", "FusedAttentionBlock", "FusedResidualLN"],
     "FusedTransformerLayer at %"),
    ("pre_ln", ["FusedMatMulBiasAct %", "FusedAttentionBlock"],
     "FusedTransformerLayer at %"),
])
def test_a_layer_not_fused_says_what_was_made_and_missed(capsys, tmp_path, variant, made, missed):
    path = _ir(capsys, tmp_path, variant, 0)
    code, out, _ = run(capsys, "explain", path)
    line = next(ln for ln in out.splitlines() if ln.startswith("layer 0: NOT fused"))
    head, _, rest = line.partition(": made ")
    assert head.startswith("layer 0: NOT fused (expected ") and rest, line
    got, _, lost = rest.partition("; missed ")
    assert all(m in got for m in made) and lost.startswith(missed), line
    code2, out, _ = run(capsys, "explain", path, "--json")
    v = json.loads(out)["layers"][0]
    assert code2 == code and v["status"] == "not fused"
    assert v["missed_products"] and lost == ", ".join(v["missed_products"])
    assert all(x.split(" %")[0] in got for x in v["done"])  # the line lists `done` (grouped: `OP xN (...)`)


def test_json_remedy_agrees_with_its_fix(capsys):
    """A fix line that says there is nothing to change in the model is no remedy `in the model`. n4-09's dequant
    scale is a gap in rlxviz's ops (`test_compiler_only_gap`: no first rejection), so its refusal and its fix check."""
    path = CASES / "n4-09-dequant-scale-after-matmul.rlx"
    trace = Pipeline.canonical().run(parse_ir(path.read_text()))
    (r,) = [r for s in trace.steps for r in s.rejections if r.guard == "scale_before_bias" and r.headline]
    assert r.hint.startswith(NOTHING_TO_CHANGE) and r.remedy == COMPILER_ONLY, r
    code, out, _ = run(capsys, "explain", path, "--json")
    (f,) = [f for f in json.loads(out)["fix_checks"] if f["guard"] == "scale_before_bias"]
    assert code == 0 and f["fix"] == r.hint, f


def test_the_why_tab_says_the_same_made_and_missed(capsys, tmp_path):
    """The app's Why tab words the layer as `explain -v` does (one formatter, `text.render_layer`)."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    path = _ir(capsys, tmp_path, "dead_h1_user", 0)
    s = AppState(runner=Runner(background=False), source="ir", ir_text=path.read_text())
    _, out, _ = run(capsys, "explain", path, "-v")
    line = next(ln for ln in out.splitlines() if ln.startswith("layer 0: NOT fused"))
    why = s.why_layer(0).replace("\\", "")
    assert "; missed FusedTransformerLayer at %" in line and line.split(": made ")[1].split(";")[0] in why, why
