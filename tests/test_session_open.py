"""`session.open(OpenRequest)`: the one composition of "load a model and run the pipeline" that the CLI and the app
both call (issue 36, item 5)."""

import ast
import dataclasses
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.cli.loading import _run_model
from rlxviz.ir import format_graph
from rlxviz.session import LimitError, Limits, OpenRequest, PipelineError, SessionError
from rlxviz.session import opening as OPEN

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "data" / "cases" / "03-prescaled-query.rlx"


def test_open_is_load_then_the_pipeline_on_its_graph():
    opened = session.open(OpenRequest(source="bert-tiny", seq=8, pipeline="rlx"))
    model = session.load("bert-tiny", 1, 8)
    trace = session.run_pipeline(model.graph, session.build_pipeline("rlx"))
    assert opened.model is model, "the model cache is shared: the same load, not a second one"
    assert opened.trace is trace and opened.pipeline.name == "rlx"
    assert opened.pipeline.effective_params["fab_max_tokens"] == 64, "a profile's own gate stays without a threshold"


@pytest.mark.parametrize("threshold, gate", [(None, 64), (40, 40)])
def test_the_threshold_is_given_once_for_the_sequence_and_the_gate(threshold, gate):
    r = OpenRequest(source="bert-tiny", seq=8, variant="over_threshold", threshold=threshold)
    opened = session.open(r)
    assert r.gate == gate and opened.pipeline.effective_params["fab_max_tokens"] == gate
    seq = opened.model.graph.inputs[0].shape[1]
    assert seq > gate > 8, f"batch 1: the sequence was raised over the gate it was given (seq {seq}, gate {gate})"


def test_a_misspelt_pass_is_refused_before_any_file_is_read(tmp_path):
    missing = str(tmp_path / "nowhere.onnx")
    with pytest.raises(PipelineError, match="unknown pass 'fuse_sdpaa'"):
        session.open(OpenRequest(source=missing, pipeline="fuse_sdpaa"))
    with pytest.raises(SessionError, match="no such file"):
        session.open(OpenRequest(source=missing))


def test_a_request_is_frozen_hashable_and_checks_its_kind():
    r = OpenRequest(source="x.onnx", dims={"batch": 2}, input_shapes={"ids": [2, 5]}, pipeline=["fuse_sdpa"],
                    allowed_roots=[str(ROOT)])
    assert r.dims == (("batch", 2),) and r.input_shapes == (("ids", (2, 5)),) and r.pipeline == ("fuse_sdpa",)
    assert r.allowed_roots == (ROOT,) and hash(r) == hash(dataclasses.replace(r))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.seq = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        OpenRequest("bert-tiny")  # type: ignore[misc]  # keyword-only: no positional mix-up of batch and seq
    with pytest.raises(SessionError, match="unknown source kind 'onnx'"):
        OpenRequest(source="a.onnx", kind="onnx")  # type: ignore[arg-type]


def test_each_kind_reads_its_source():
    text = CASE.read_text()
    from_text = session.open_model(OpenRequest(source=text, kind="ir-text"))
    from_file = session.open_model(OpenRequest(source=str(CASE)))
    assert format_graph(from_text.graph) == format_graph(from_file.graph)
    built = session.open_model(OpenRequest(source="bert-tiny", kind="built", batch=2, seq=4, style="hf"))
    assert built.graph.inputs[0].shape == (2, 4)
    with pytest.raises(SessionError, match="run takes a preset name or a checkpoint folder, not a file"):
        session.open_model(OpenRequest(source=str(CASE), kind="built"))
    with pytest.raises(SessionError, match="unknown model 'bert-tinyy'"):
        session.open_model(OpenRequest(source="bert-tinyy", kind="built"))


def test_the_workload_is_checked_after_the_load_and_before_the_run(monkeypatch):
    r = OpenRequest(source="bert-tiny", seq=8, limits=Limits(max_memory_mb=2, source="test"), workload="time",
                    label="bert-tiny --layers 0-1")
    assert session.open_model(r).name == "bert-tiny", "the graph's own run fits in 2 MiB"
    ran = []
    monkeypatch.setattr(OPEN, "run_pipeline", lambda *a: ran.append(a))
    with pytest.raises(LimitError, match=r"^bert-tiny --layers 0-1: time needs"):
        session.open(r)  # what timing holds (the oracle's copies) does not
    assert not ran, "refused before the pipeline ran"
    with pytest.raises(LimitError, match="^bert-tiny: "):
        session.open(dataclasses.replace(r, limits=Limits(max_memory_mb=0.5, source="test")))  # the load refuses


def _calls(path: Path) -> set[str]:
    """Names called in a module (`f(...)`, `x.f(...)`)."""
    tree = ast.parse(path.read_text())
    return {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_no_front_end_composes_load_and_run_itself():
    composing = {"load_isolated", "load_ir_text", "load_ir_file", "load_onnx", "load_checkpoint", "run_pipeline"}
    for folder in ("cli", "app"):
        for f in sorted((ROOT / "rlxviz" / folder).glob("*.py")):
            found = _calls(f) & composing
            assert not found, f"{f.relative_to(ROOT)} calls {sorted(found)}: open a model with session.open_*"


def test_the_cli_and_the_app_open_the_same_run():
    import argparse

    args = argparse.Namespace(model="bert-tiny", batch=1, seq=8, style=None, variant="over_threshold",
                              variant_layer=None, threshold=None, pipeline="canonical", max_memory_mb=None,
                              dim=None, inputs=None)
    model, trace = _run_model(args)
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, variant="over_threshold")
    assert s.model.graph.inputs[0].shape == model.graph.inputs[0].shape
    assert s.trace.final.fused_op_counts() == trace.final.fused_op_counts()
    assert s.trace.steps[0].params == trace.steps[0].params, "one gate, as the CLI runs it"


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_an_export_opened_with_its_input_shapes_is_the_export_bound_to_them(name):
    onnx, npz = (ROOT / "tests" / "fixtures" / "onnx" / f"{name}{ext}" for ext in (".onnx", ".npz"))
    shapes = {k: shape for k, (shape, _) in session.npz_headers(str(npz)).items() if not k.startswith("out:")}
    model = session.open_model(OpenRequest(source=str(onnx), kind="onnx-inputs", input_shapes=shapes))
    assert {n.attrs["name"]: n.shape for n in model.graph.inputs} == shapes
    auto = session.open_model(OpenRequest(source=str(onnx), input_shapes=shapes))  # `explain --inputs`'s road
    assert format_graph(auto.graph) == format_graph(model.graph)


def test_a_file_that_is_no_export_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(SessionError) as e:
        session.open_model(OpenRequest(source=str(bad), kind="onnx-inputs", input_shapes={"input_ids": (1, 4)}))
    assert "\n" not in str(e.value) and "broken.onnx" in str(e.value)


def test_a_checkpoint_outside_the_allowed_folders_is_refused_before_it_is_read(tmp_path):
    inside, outside = tmp_path / "models", tmp_path / "elsewhere"
    inside.mkdir(), outside.mkdir()
    (outside / "config.json").write_text("{}")
    for isolated in (False, True):
        with pytest.raises(SessionError, match="outside|allowed"):
            session.open_model(OpenRequest(source=str(outside), allowed_roots=[inside], isolated=isolated))
