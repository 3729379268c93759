"""Scale advice looks for a scale anywhere on Q's or K's path before it speaks (issue 37, item 7): ESM scales Q
before its RoPE, which fuse_sdpa cannot fold past the rotation; telling it to scale the scores by 1/sqrt(head_dim)
would apply the scale twice."""
from pathlib import Path

from clirun import run, unplaced

ROOT = Path(__file__).parent
ESM = ROOT / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx"
ESM_LIKE = ROOT / "data" / "cases" / "esm-like-q-scaled-before-rope.rlx"


def _default_scale_line(capsys, model) -> str:
    _, out, _ = run(capsys, "explain", model)
    lines = [ln for ln in out.splitlines() if "guard default_scale" in ln or "(default_scale): " in unplaced(ln)]
    assert lines, out
    return lines[0]


def test_esm_q_scaled_before_rope_is_found_and_no_second_scale_is_advised(capsys):
    line = _default_scale_line(capsys, ESM)
    assert "scaled earlier on the operands' path: Q mul" in line and "* 0.25" in line
    assert "scaled by 1/sqrt(16) in all" in line and "no model change is needed" in line
    assert "scale them by" not in line


def test_a_partial_scale_on_q_is_named_with_its_product(capsys):
    line = _default_scale_line(capsys, ESM_LIKE)
    assert "Q mul (node 61" in line and "scaled by 0.5 in all, not 1/sqrt(16) = 0.25" in line
    assert "scale them by" not in line and "no model change" not in line


def test_unscaled_scores_still_get_the_advice(capsys, tmp_path):
    text = ESM_LIKE.read_text().replace("%61 = mul(%21, %60)", "%61 = add(%21, %60)").replace("value=0.5", "value=0.0")
    p = tmp_path / "unscaled.rlx"
    p.write_text(text)
    line = _default_scale_line(capsys, p)
    assert "scaled earlier" not in line
