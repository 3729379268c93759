"""A pre-norm residual's fix names the residual stream, not a probe (newcomer report): bert-tiny/MiniLM's "pre-LN
ordering" variant read "fix: none in the model: add (node 114) reads sum, and its result flows on to graph output #0,
...: it is part of what the model computes and returns", the words of a probe, while the second reader is the next
residual add. `readers.extra_readers_why` (the one rule the text, `--json` and the app's Why tab word a reader refusal
with) now says the residual stream continues past the norm and names the compiler fix (a rule that builds the fused
op's two-output form), and keeps the probe words for a reader that is no residual add (an add of the sum and a value
not computed from it).
"""

from __future__ import annotations

import json

import pytest
from test_app_views import tiny
from test_why_reader_advice import variant

from rlxviz.cli import main
from rlxviz.ir import parse_ir
from rlxviz.passes.guard import NO_MODEL_FIX
from rlxviz.passes.readers import continues_residual

STREAM = "the residual stream continues past the norm"
PROBE = "it is part of what the model computes and returns"


def _fixes(d: dict) -> list[str]:
    return [o["fix"] for lv in d["layers"] for o in [lv["first"], *lv["illegal"], *lv["rejections"]]
            if o and o["fix"].startswith(NO_MODEL_FIX) and " reads " in o["fix"]]


@pytest.mark.parametrize("preset", ["bert-tiny", "minilm-shaped"])
def test_a_pre_ln_residual_reads_as_the_residual_stream_in_text_json_and_app(preset, capsys):
    main(["explain", preset, "--variant", "pre_ln", "--seq", "8", "--json"])
    fixes = _fixes(json.loads(capsys.readouterr().out))
    fix = "builds FusedResidualLN(with_sum=true)"
    assert fixes and all(STREAM in f and fix in f and PROBE not in f for f in fixes), fixes
    # the residual refusal is the variant's consequence, listed after its first rejection (post_ln_order,
    # `test_deviation_first`): its fix is in the text's per-rule lines
    main(["explain", preset, "--variant", "pre_ln", "--seq", "8", "--verbose"])
    out = capsys.readouterr().out
    assert STREAM in out and PROBE not in out
    s = tiny(variant="pre_ln") if preset == "bert-tiny" else None
    if s is not None:
        why = s.why_layer(0) + s.why_layer(1)  # the variant's layer, and its sibling
        assert STREAM in why and PROBE not in why, why


@pytest.mark.parametrize("other", ["%39", "%0"])
def test_an_add_of_the_sum_and_a_value_not_computed_from_it_is_no_residual_stream(other):
    """n4-15 with its probe an `add(sum, X)`, X the sum itself or a value from before it: no later sublayer's
    output, so no residual stream (the probe words stay, `test_why_reader_advice`'s variants)."""
    text = variant(reader_of="%39", reader_returned=True).replace("mul(%39, %39)", f"add(%39, {other})")
    g = parse_ir(text)
    assert g[43].op.value == "add" and 39 in g[43].inputs
    assert not continues_residual(g, 39, 43)
    # the FFN's residual add reads h1 (%42) and the FFN's output, computed from h1: it continues the stream
    ffn_add = [u.id for u in g.users(42) if u.op.value == "add"]
    assert ffn_add and all(continues_residual(g, 42, u) for u in ffn_add)


def test_n4_15s_probe_keeps_the_probe_words(tmp_path, capsys):
    text = variant(reader_of="%42", reader_returned=True)
    p = tmp_path / "m.rlx"
    p.write_text(text)
    main(["explain", str(p), "--json"])
    fixes = _fixes(json.loads(capsys.readouterr().out))
    assert fixes and all(PROBE in f and STREAM not in f for f in fixes), fixes
