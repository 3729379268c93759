"""The start strip on one's own model (an ONNX export): ② does not apply there (teaching variants change a built
BERT graph), so no line sends the user to it (after ① it said "Next: ① again, then ②" beside the disabled ②, and ③
on a fused layer said "Next: ② breaks a layer on purpose")."""

import html
import re

from test_app_views import ROOT, tiny

from rlxviz.app.start import StartHere


def _line(start: StartHere) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", start.note.object))


def _onnx_start(name: str) -> tuple[object, StartHere]:
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    s.load_upload({name.rsplit("/", 1)[-1]: (ROOT / "tests/fixtures/onnx" / name).read_bytes()})
    assert s.model is not None and "onnx_file" in s.model.meta, s.message
    return s, start


def test_steps_on_an_onnx_export_never_point_at_the_disabled_break():
    for name in ("gpt2.onnx", "zoo/albert.ts-eager.onnx", "zoo/bart-encoder.dynamo-sdpa.onnx"):
        s, start = _onnx_start(name)
        assert start.brk.disabled
        unfused = start.unfused_layers()  # GPT-2's layers do not fuse whole; MiniLM's do
        for _ in range(len(s.version_labels) + 1):  # every version, the last one and back to the input
            start.step.clicks += 1
            line = _line(start)
            assert "②" not in line.split(". Showing")[0], line
            why = f"③ to ask why layer {unfused[0]} did not fuse" if unfused else "③ to ask why a layer fused"
            assert line.startswith((f"Next: ① again, or {why}.", f"Next: {why}, or ① back to the input")), line
        start.why.clicks += 1
        assert "②" not in _line(start), _line(start)
        said = _line(start)
        assert ("the first guard that failed" in said) if unfused else (
            "fused: nothing it expects was refused" in said or " fused as far as " in said), said


def test_the_why_step_on_a_layer_fused_only_as_far_as_rlxvizs_ops_go_says_so():
    """Newcomer run 5: deit's ③ read "Layer 0 fused: nothing refused it." over a Why tab that lists the attention
    block rlxviz has no form for (no mask operand); the line says the verdict's own words and what rlxviz lacks."""
    s, start = _onnx_start("cases/deit.ortopt.onnx")
    start.why.clicks += 1
    said = _line(start)
    assert ("Layer 0 fused as far as rlxviz's ops go (rlxviz lacks FusedMatMulBiasAct with a residual operand added "
            "before its bias, FusedAttentionBlock without a mask operand: a compiler fix, nothing in the model to "
            "change)") in said  # as the headline says it (the bias ONNX Runtime moved after the residual too)
    assert "nothing refused" not in said and "nothing it expects" not in said, said


def test_steps_on_a_built_model_still_point_at_break():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.step.clicks += 1
    assert not start.brk.disabled and _line(start).startswith("Next: ① again, then ②."), _line(start)
