"""The headline's count says "fused as expected" of every fused layer; a layer fused only as far as legal (a product
illegal for it left unmade) got a note under it in no place, though one fused only as far as rlxviz's ops go did. Both
notes now come from one function (`headline_notes`), in the text and in `--json`; counts and exit codes stay. A layer
held back only by rlxviz's ops is no longer among "them": the headline counts it apart (tests/test_gap_headline.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from clirun import run as cli_run

from rlxviz.passes.why.excused import OpGap
from rlxviz.passes.why.text import headline_notes
from rlxviz.passes.why.verdict import LayerVerdict

CASES = Path(__file__).parent / "data" / "cases"


@pytest.mark.parametrize("name, rules", [
    ("n4-15-residual-logged.rlx", "fuse_residual_ln.residual, fuse_transformer_layer.bert_post_ln"),
    ("n4-13-cross-layer-kv-sharing.rlx", "fuse_attention_block.qkv_attention_out"),
])
def test_a_layer_fused_as_far_as_legal_is_noted_under_the_headline(capsys, name, rules):
    code, text, err = cli_run(capsys, "explain", CASES / name)
    assert code == 0 and "Traceback" not in err, err
    head, note = text.splitlines()[:2]
    assert head.endswith("layer(s) fused as expected"), head
    assert note == f"  1 of them only as far as legal: {rules} illegal for it", text
    jcode, out, _ = cli_run(capsys, "explain", CASES / name, "--json")
    j = json.loads(out)
    assert jcode == code and j["ok"] and j["fused_layers"] == j["checked_layers"]  # counts unchanged
    assert j["headline"] == head and j["headline_notes"] == [note.strip()]
    assert sum(d["status"] == "fused as far as legal" for d in j["layers"]) == 1


def layer(fused: bool = True, illegal: tuple[str, ...] = (), gaps: tuple[str, ...] = ()) -> SimpleNamespace:
    """A layer verdict as `headline_notes` reads it (`LayerVerdict`'s fields, `legal_only` and `gap_forms`, the
    latter read by `LayerVerdict`'s own property)."""
    v = SimpleNamespace(fused=fused, legal_only=fused and bool(illegal), gaps=[OpGap(f, "r.f", "g") for f in gaps],
                        illegal=[SimpleNamespace(rule=r) for r in illegal], gap_only=fused and bool(gaps))
    v.gap_forms = LayerVerdict.gap_forms.fget(v)
    return v


@pytest.mark.parametrize("layers, notes", [
    ([layer(), layer()], []),
    ([layer(illegal=("a.x",)), layer(illegal=("a.x", "b.y")), layer()],
     ["2 of them only as far as legal: a.x, b.y illegal for them"]),
    ([layer(illegal=("a.x",), gaps=("G",)), layer(fused=False, illegal=("c.z",))], []),
    ([layer(illegal=("a.x",), gaps=("G",)), layer(illegal=("b.y",))],
     ["1 of them only as far as legal: b.y illegal for it"]),
])
def test_notes_count_each_shortfall_of_the_fused_layers(layers, notes):
    assert headline_notes(SimpleNamespace(layers=layers)) == notes
