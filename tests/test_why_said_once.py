"""The Why tab at 1280 px (newcomer report 17): its text printed the "the layers differ in" block twice (the verdict's
line, then `explain`'s own `compared with ...` after the rules' outcomes), and its Layer picker cut bart-full's
`decoder layer 0` to `decoder layer`."""

from __future__ import annotations

from pathlib import Path

from clirun import run

from rlxviz.app.text import SELECT_PAD_PX, select_width

BART = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "bart-full.onnx"
DIFF = "layer 0: reduce_mean@probe(layer_norm@attention.output.LayerNorm) users=0"


def test_the_sibling_comparison_is_said_once_in_the_verbose_text_and_the_why_tab(capsys):
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    code, out, err = run(capsys, "explain", "bert-tiny", "--variant", "dead_h1_user", "-v")
    assert out.count(DIFF) == 1, out
    assert "the layers differ in:" in out and "compared with layer 1" not in out, out
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, variant="dead_h1_user")
    why = s.why_layer(0).replace("\\", "")
    assert why.count("reduce_mean@probe") == 1 and why.count("differ in") == 1, why
    # a layer whose verdict names no sibling keeps `explain`'s own comparison, once (docs/passes.md's tanh-GELU run)
    code, out, err = run(capsys, "explain", "bert-tiny", "--variant", "tanh_gelu", "--layer", 0, "-v")
    assert out.count("compared with layer 1, where fuse_transformer_layer.bert_post_ln fused:") == 1, out
    assert "the layers differ in:" not in out


def test_a_layer_pickers_width_shows_its_longest_label_whole():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.whyview import WhyView

    assert select_width(["choose", "decoder layer 0"], 120) >= len("decoder layer 0") * 6.2 + SELECT_PAD_PX
    assert select_width(["x"], 120) == 120 and select_width(["y" * 80], 100, 300) == 300
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = WhyView(state=s)
    s.load_upload({BART.name: BART.read_bytes()})
    assert s.message_kind != "danger", s.message
    labels = list(view.layer.options)
    assert "decoder layer 0" in labels, labels
    assert view.layer.width == select_width(labels, 120) > 120, view.layer.width
