"""One policy for a model change that keeps the numbers up to rounding only (newcomer: the advice differed by model).

bert.ortopt's fix line refused a change that rounds differently ("no change keeps every number"), t5-encoder.ortopt
offered one (fold 2.82843 into the Q weight, "the same numbers up to rounding"), and t5.encdec, whose scores carry
no scale node at all, called the same fold unknown ("no change to the model that keeps its numbers is known").

Decision: a rounding-only change rlxviz can check (the scale fold: `scale_fold`, its what-if in `passes.whatif`) is
offered wherever the checker applies, T5's unscaled scores included (the fold adds the scores' scale as a new mul),
and its line says `ROUNDING_ONLY` with the error the check measured; a rounding-only change rlxviz cannot check (the
bias moved before the residual) is `rounding_not_offered`: not offered, and why. The same words in `explain -v`,
`--json` and the app's Why tab (`session.advice.advised`, the service the tab reads).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run

from rlxviz.passes import Pipeline
from rlxviz.session import load
from rlxviz.session.advice import CHECKED, advised

ONNX = Path(__file__).parent / "fixtures" / "onnx"
T5_ORTOPT = ONNX / "ortopt" / "t5-encoder.ortopt.onnx"
T5_ENCDEC = ONNX / "zoo" / "t5.encdec.onnx"
BERT_ORTOPT = ONNX / "ortopt" / "bert.ortopt.onnx"
OFFERED = re.compile(r"fold the scale into q \(matmul, node \d+\): multiply its weight .* by 2\.82843 = 1 / 0\.353553 "
                     r"and scale the scores by the default 1/sqrt\(8\): .* \(changes the numbers at rounding level "
                     r"only, max err (\S+) in float64 on random, fully_masked_row, left_padding: 2\.82843 is not a "
                     r"power of two\)$")
NOT_OFFERED = ("a workaround, not offered: adding the bias before the residual ((x @ w + bias) + skip, the order "
               "FusedTransformerLayer computes) changes the numbers at rounding level only (it rounds differently "
               "from the file's (x @ w + skip) + bias), by reasoning, not measured: rlxviz has no check for that "
               "change")
ROUNDING_ONLY = "changes the numbers at rounding level only"  # `refusal_kinds.ROUNDING_ONLY`, pinned here
UNKNOWN = ("unknown", "is known to make", "no change keeps every number", "the same numbers up to rounding")


def _views(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[str, dict]:
    code, text, err = run(capsys, "explain", path, "-v")
    jcode, out, _ = run(capsys, "explain", path, "--json")
    assert code == jcode == 0, err
    return text, json.loads(out)


@pytest.mark.parametrize("path", [T5_ORTOPT, T5_ENCDEC], ids=["t5-encoder.ortopt", "t5.encdec"])
def test_the_scale_fold_is_offered_measured_on_every_t5(capsys, path):
    """The same form (scale 1.0 where the block computes 1/sqrt(8)) gets the same checked fold on both exports: the
    ORT export's scores' `mul * 1` changed, the dynamo export's unscaled scores given a new mul."""
    text, j = _views(capsys, path)
    encoder = [f for f in j["fix_checks"] if f["guard"] == "default_scale" and f["status"] == CHECKED]
    assert len(encoder) >= 2, j["fix_checks"]
    for f in encoder:
        m = OFFERED.match(f["fix"])
        assert m is not None and 0.0 < float(m[1]) < 1e-6, f["fix"]
        assert f["printed_as_fix"] and f["fix"] in text  # -v prints what --json says
        assert f"a workaround in the model: {f['fix']}" in text
    assert f"a workaround in the model in {j['gap_layers']} of them (it {ROUNDING_ONLY}; " in j["headline"]
    assert not any(w in text for w in UNKNOWN), [w for w in UNKNOWN if w in text]


def test_bert_says_the_bias_move_is_not_offered_and_why(capsys):
    """The rounding-only change rlxviz cannot check is named, marked as rounding-only in the same words, and not
    offered: no line calls it unknown or says no change keeps the numbers."""
    text, j = _views(capsys, BERT_ORTOPT)
    lines = [f["fix"] for f in j["fix_checks"] if f["guard"] == "ln1_no_bias"]
    assert lines and all(f == f"nothing to change in the model: {NOT_OFFERED}" for f in lines), lines
    assert text.count(f"fix: nothing to change in the model: {NOT_OFFERED}") == len(lines), text
    assert not any(w in text for w in UNKNOWN), [w for w in UNKNOWN if w in text]


@pytest.mark.parametrize("path, offered", [(T5_ENCDEC, True), (BERT_ORTOPT, False)], ids=["t5.encdec", "bert.ortopt"])
def test_the_why_tab_service_says_the_same(path, offered):
    """`advised` (what the app's Why tab, node panel and export read) gives each refusal the line `explain` prints."""
    m = load(str(path))
    trace = advised(Pipeline.canonical().run(m.graph), m.name, m.random_feeds(0), m.weights)
    hints = [r.hint for r in trace.rejections if r.guard in ("default_scale", "ln1_no_bias") and r.headline]
    if offered:  # the self-attentions' folds; a cross-attention's fold is checked too, and does not fuse (T5's bias)
        folds = [h for h in hints if h.startswith("fold the scale")]
        assert len(folds) == 4 and all(OFFERED.match(h) for h in folds), hints
    else:
        assert hints and all(h.endswith(NOT_OFFERED) for h in hints), hints
    assert not any(w in h for h in hints for w in UNKNOWN), hints
