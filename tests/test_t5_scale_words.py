"""An unscaled attention's refusal never tells the user to scale the scores (newcomer run 20).

T5 computes its scores without 1/sqrt(head_dim) on purpose (the scale is folded into its weights). `default_scale`'s
message said "the scores are not scaled (scale 1.0): scale them by 1/sqrt(head_dim)", a change to every output of the
model, while the next line said no change to the model keeps its numbers. The message now says what the block lacks.
"""

from __future__ import annotations

from pathlib import Path

from clirun import run

T5 = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "t5.encdec.onnx"


def test_t5s_unscaled_attention_is_the_models_own_choice(capsys):
    code, out, err = run(capsys, "explain", T5, "-v")
    assert code == 0, err
    assert "scale them by" not in out, out
    assert out.count("the scores are not scaled (scale 1.0), the model's own choice") >= 2, out
