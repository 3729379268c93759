"""Loading and timing faults a newcomer run found (the kind, each with variants of our own):

1. a relative path that lies inside an allowed folder but names nothing is missing ("no such file or folder", where
   it looked), not "outside the allowed model folders"; a path that really lies outside stays "outside";
2. an inputs file (`Your inputs (.npz)`) with another batch or sequence length sets them, as `rlxviz time --inputs`
   does (`session.inputs.shape_from_inputs`), and is used; one that cannot be used is refused, its name leaves the
   file box (choosing it again is a new choice), and no file name the run does not use is shown;
3. "Fusion or kernels?" prints a product that is true of the factors it prints;
4. the upload area says where a bigger model goes in one sentence;
5. an upload (or path) that replaces another says "Now showing NEW (upload), was OLD (upload)."
"""

from __future__ import annotations

import io
import random
import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV, SourceError, check_in_roots, resolve_in_roots, where_big_files
from rlxviz.app.state import AppState
from rlxviz.app.timingview import TimingView

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


# ============================================================ 1. missing, not outside
@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two allowed folders `a` (holding `onnx/m.onnx` and a link `linked` to `out`) and `b`, and `out` beside them."""
    a, b, out = (tmp_path / n for n in ("a", "b", "out"))
    for d in (a / "onnx", b, out):
        d.mkdir(parents=True)
    (a / "onnx" / "m.onnx").write_bytes(b"x")
    (a / "linked").symlink_to(out, target_is_directory=True)
    return a.resolve(), b.resolve(), out.resolve()


def refusal(typed: str, allowed: list[Path]) -> str:
    """What the app's path check says of `typed` (as `Runs._load_model` runs it), or '' when it is accepted."""
    try:
        check_in_roots(resolve_in_roots(typed, allowed), allowed)
    except SourceError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("typed, rel", [("onnx/nothere.onnx", "onnx/nothere.onnx"),
                                        ("nothere/x.onnx", "nothere/x.onnx"),
                                        ("./onnx/../onnx/gone.onnx", "onnx/gone.onnx"), ("gone", "gone")])
def test_a_missing_relative_path_inside_an_allowed_folder_is_missing_not_outside(roots, monkeypatch, typed, rel):
    a, _, out = roots
    monkeypatch.chdir(out)  # the server's working folder is no allowed folder
    said = refusal(typed, [a])
    assert said.startswith(f"{typed}: no such file or folder (looked in ") and "outside" not in said, said
    looked = Path(said.split("(looked in ", 1)[1].rstrip(")"))
    assert looked.resolve() == (a / rel).resolve(), said


def test_a_missing_relative_path_names_every_allowed_folder_it_looked_in(roots, monkeypatch):
    a, b, out = roots
    monkeypatch.chdir(out)
    said = refusal("onnx/nothere.onnx", [a, b])
    assert said == f"onnx/nothere.onnx: no such file or folder (looked in {a / 'onnx/nothere.onnx'}, " \
                   f"{b / 'onnx/nothere.onnx'})", said


@pytest.mark.parametrize("typed", ["../out/nothere.onnx", "onnx/../../out/nothere.onnx", "linked/nothere.onnx",
                                   "../x.onnx"])
def test_a_missing_path_that_lies_outside_every_allowed_folder_stays_outside(roots, monkeypatch, typed):
    a, _, out = roots
    monkeypatch.chdir(out)
    said = refusal(typed, [a])  # `linked` is a's link to `out`: what it names lies outside, whether it exists or not
    assert said.startswith(f"{typed}: outside the allowed model folders ({a})"), said


def test_an_absolute_path_and_an_existing_relative_one_are_said_as_before(roots, monkeypatch):
    a, _, out = roots
    monkeypatch.chdir(out)
    assert refusal(str(a / "onnx/nothere.onnx"), [a]) == f"{a / 'onnx/nothere.onnx'}: no such file or folder"
    assert refusal(str(out / "x.onnx"), [a]).startswith(f"{out / 'x.onnx'}: outside the allowed model folders")
    assert refusal("onnx/m.onnx", [a]) == ""


def test_the_path_box_says_a_missing_relative_path_is_missing(roots, monkeypatch):
    """The newcomer's case in the app: `onnx/nothere.onnx` under RLXVIZ_ALLOWED_DIRS read "outside"."""
    a, _, out = roots
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(a))
    monkeypatch.chdir(out)
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    for typed, words in (("onnx/nothere.onnx", f"no such file or folder (looked in {a / 'onnx/nothere.onnx'})"),
                         ("../out/nothere.onnx", "outside the allowed model folders")):
        s.param.update(checkpoint_dir=typed, source="checkpoint")
        assert s.message_kind == "danger" and s.message.startswith(f"{typed}: {words}"), s.message
        assert s.message.endswith("Still showing bert-tiny.") and s.model.name == "bert-tiny", s.message


# ============================================================ 2. an inputs file's batch and sequence length
def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def bert_io(batch: int, seq: int, **more: np.ndarray) -> bytes:
    """Inputs for bert-tiny: ids and a full mask, int64 [batch, seq]."""
    ids = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) % 100
    return npz(input_ids=ids, attention_mask=np.ones((batch, seq), np.int64), **more)


def tiny(**kw: object) -> tuple[AppState, TimingView]:
    s = AppState(runner=Runner(background=False), preset="bert-tiny", **{"batch": 1, "seq": 16, **kw})
    return s, TimingView(state=s)


def choose(view: TimingView, name: str, data: bytes) -> None:
    """Choose a file in the Timing tab's box, as the browser's file chooser sets it."""
    view.inputs.param.update(filename=name, value=data)


def used(s: AppState, view: TimingView, name: str) -> None:
    assert s.user_inputs is not None and s.inputs_file == name and view.inputs.filename == name, s.message
    assert view.inputs.value is not None


def refused(s: AppState, view: TimingView, name: str, *words: str) -> None:
    """Refused: no arrays, no name in the state or the box, and the message says why and that the file is unused."""
    assert s.user_inputs is None and s.inputs_file == "" and view.inputs.value is None, s.message
    assert not view.inputs.filename
    assert s.message_kind == "warning" and f"{name} is not used" in s.message, s.message
    assert all(w in s.message for w in words), s.message


@pytest.mark.parametrize("batch, seq", [(2, 8), (3, 5), (1, 32)])
def test_an_inputs_file_sets_batch_and_sequence_length_as_the_cli_does(batch, seq):
    s, view = tiny()
    choose(view, "mine.npz", bert_io(batch, seq))
    assert (s.batch, s.seq) == (batch, seq) and s.model.graph.inputs[0].shape == (batch, seq)
    used(s, view, "mine.npz")
    assert s.message.startswith(f"Batch {batch} and sequence length {seq} set from mine.npz"), s.message
    assert "The next timing runs on the arrays of mine.npz" in s.message and s.message_kind == "info"
    assert s.user_inputs.feeds["input_ids"].shape == (batch, seq)


def test_hidden_states_set_them_too_and_expected_outputs_are_checked():
    s = AppState(runner=Runner(background=False), preset="llama-block", batch=1, seq=8)
    view = TimingView(state=s)
    hidden = s.model.graph.inputs[0].shape[-1]
    data = npz(hidden_states=np.zeros((2, 6, hidden), np.float32), **{"out:y": np.zeros((2, 6, hidden), np.float32)})
    choose(view, "block.npz", data)
    assert (s.batch, s.seq) == (2, 6)
    used(s, view, "block.npz")
    assert "Batch 2 and sequence length 6 set from block.npz" in s.message
    # the expected output is checked as `rlxviz time --inputs` checks it: `y` names no output of the model
    assert ("On the arrays of block.npz: version 0 could not be checked against the model: block.npz: out:y names no "
            "output of the model (its outputs: last_hidden_state)") in s.message and s.message_kind == "danger"


def test_the_timing_runs_on_the_file_and_a_new_shape_drops_it_and_empties_the_box():
    s, view = tiny(repeat=1, warmup=0)
    choose(view, "mine.npz", bert_io(2, 8))
    s.time_all()
    assert "inputs: user" in s.timing_policy, s.timing_policy
    s.seq = 12  # the sidebar changed by hand: the arrays are not the new model's, and the box names no file
    assert s.user_inputs is None and s.inputs_file == "" and view.inputs.value is None and not view.inputs.filename
    s.time_all()
    assert "inputs: random" in s.timing_policy, s.timing_policy


def test_a_file_whose_shapes_the_sidebar_cannot_take_is_refused_and_can_be_chosen_again():
    s, view = tiny()
    data = bert_io(1, 300)  # past bert-tiny's 128-row position table
    choose(view, "long.npz", data)
    refused(s, view, "long.npz", "Sequence length takes 2..128", "position table")
    assert (s.batch, s.seq) == (1, 16)
    s.message = ""
    choose(view, "long.npz", data)  # the same file again: a new choice, said again
    refused(s, view, "long.npz", "Sequence length takes 2..128")


@pytest.mark.parametrize("arrays, words", [
    ({"input_ids": np.zeros((2, 8), np.int64)},  # a name missing: no shape would help
     ["no array for input(s) 'attention_mask'", "the graph takes input_ids, attention_mask"]),
    ({"input_ids": np.zeros((2, 8), np.int64), "attention_mask": np.ones((2, 8), np.int64),
      "token_type_ids": np.zeros((2, 8), np.int64)}, ["unknown input(s) token_type_ids"]),
    ({"input_ids": np.zeros((1, 16), np.int32), "attention_mask": np.ones((1, 16), np.int64)}, ["is int32"]),
    ({"input_ids": np.zeros((2, 8, 1), np.int64), "attention_mask": np.ones((2, 8), np.int64)},
     ["input_ids must be a non-empty rank-2 array"]),
])
def test_a_file_no_batch_or_sequence_length_would_fit_is_refused_without_a_reload(arrays, words):
    s, view = tiny()
    model = s.model
    choose(view, "bad.npz", npz(**arrays))
    refused(s, view, "bad.npz", *words)
    assert s.model is model and (s.batch, s.seq) == (1, 16)


def test_ir_text_fixes_its_shapes_so_a_file_of_others_is_refused():
    from rlxviz.ir import format_graph

    s, view = tiny()
    s.param.update(ir_text=format_graph(s.model.graph), source="ir")
    choose(view, "mine.npz", bert_io(2, 8))
    refused(s, view, "mine.npz", "IR text fixes its own input shapes", "shape [2, 8], the graph needs [1, 16]")


def test_a_background_load_keeps_the_name_until_the_arrays_are_used():
    """In the served app the load the file's shapes start runs on the worker thread: the arrays are used after it."""
    s = AppState(runner=Runner(background=True), preset="bert-tiny", batch=1, seq=16)
    s.runner.wait(60)
    view = TimingView(state=s)
    choose(view, "mine.npz", bert_io(2, 8))
    assert s.inputs_file == "mine.npz" and view.inputs.value is not None  # waiting for the load, not refused
    s.runner.wait(60)
    assert (s.batch, s.seq) == (2, 8) and s.model.graph.inputs[0].shape == (2, 8)
    used(s, view, "mine.npz")


@pytest.mark.slow  # the upload loads (twice) in the isolated child process and is checked against ONNX Runtime
def test_the_newcomers_roberta_inputs_set_batch_2_and_sequence_8():
    s, view = tiny()
    s.load_upload({"roberta.onnx": (CASES / "roberta.onnx").read_bytes()})
    assert s.model.name == "roberta" and s.model.graph.inputs[0].shape == (1, 16), s.message
    choose(view, "roberta_io.npz", (CASES / "roberta_io.npz").read_bytes())
    assert (s.batch, s.seq) == (2, 8) and s.model.name == "roberta"
    used(s, view, "roberta_io.npz")
    assert s.message.startswith("Batch 2 and sequence length 8 set from roberta_io.npz"), s.message
    assert "version 0 equals the ONNX model" in s.message and "Now showing" not in s.message  # same file: quiet


def test_the_cli_and_the_app_take_the_shape_from_one_function(tmp_path):
    """`rlxviz time --inputs` reads batch and sequence length through `session.inputs.shape_from_inputs`."""
    from argparse import Namespace

    from rlxviz.cli.loading import _bound_shapes
    from rlxviz.session.inputs import shape_from_inputs

    (tmp_path / "in.npz").write_bytes(bert_io(3, 5))
    args = Namespace(dim=None, inputs=str(tmp_path / "in.npz"), model="bert-tiny", batch=1, seq=16)
    _bound_shapes(args)
    assert (args.batch, args.seq) == (3, 5) == shape_from_inputs({"input_ids": ((3, 5), np.int64)}, "in.npz")
    assert shape_from_inputs({"x": ((3, 5), np.float32)}, "in.npz") is None


# ============================================================ 3. the printed product
EQUATION = re.compile(r"(\d+\.\d\d) × (\d+\.\d\d) = (\d+\.\d\d)(?: \((\d+\.\d\d) from the unrounded ratios\))?, as all")


def test_the_shown_product_is_the_product_of_the_shown_factors():
    from rlxviz.app.timingchart import shown_product

    rng = random.Random(7)
    pairs = [(1.0312, 3.4049), (1.07, 0.6299), (1.2349, 47.03)]
    pairs += [(rng.uniform(0.05, 5), rng.uniform(0.05, 60)) for _ in range(2000)]
    pairs += [(rng.randint(1, 999) / 100 + 0.005, rng.randint(1, 999) / 100 - 0.005) for _ in range(500)]  # ties
    for a, b in pairs:
        x, y, c = (Fraction(v) for v in re.fullmatch(r"(\S+) × (\S+) = (\S+)", shown_product(a, b)).groups())
        assert (f"{float(x):.2f}", f"{float(y):.2f}") == (f"{a:.2f}", f"{b:.2f}")  # as the table prints them
        assert abs(c - x * y) <= Fraction(1, 200), (a, b, shown_product(a, b))
    assert shown_product(1.0312, 3.4049) == "1.03 × 3.40 = 3.50"
    assert shown_product(1.07, 0.6299) == "1.07 × 0.63 = 0.67"
    assert shown_product(1.2349, 47.03) == "1.23 × 47.03 = 57.85"


def test_the_fusion_or_kernels_equation_is_true_as_printed():
    from rlxviz.app.timingchart import fusion_kernels_markdown
    from rlxviz.session import FusionAndKernels
    from rlxviz.session.lowerings import FUSION_LABELS
    from rlxviz.session.timing import VersionTiming, busy_warning, paired_verdict

    rng = np.random.default_rng(5)
    base = list(10 + rng.random(21))
    rows = [VersionTiming(i, FUSION_LABELS[i], 10 - i, median_ms=float(np.median(base)), min_ms=min(base),
                          first_call_ms=5.0, max_abs=1e-7, iqr_ms=0.1, samples_ms=tuple(base)) for i in range(3)]
    for fusion, kernels in [(1.0312, 3.4049), (1.07, 0.6299), (1.2349, 47.03)]:
        f, k, t = (replace(paired_verdict(rows[0], rows[1]), ratio=r) for r in (fusion, kernels, fusion * kernels))
        text = fusion_kernels_markdown(FusionAndKernels(rows, f, k, t, busy_warning(*rows), ""))
        x, y, c, unrounded = EQUATION.search(text).groups()
        assert abs(Fraction(c) - Fraction(x) * Fraction(y)) <= Fraction(1, 200), EQUATION.search(text).group(0)
        # the total is the printed product, or the sentence gives the total from the unrounded ratios beside it
        assert (unrounded or c) == f"{t.ratio:.2f}" and f"Of the final version's {t.ratio:.2f}×" in text, text


# ============================================================ 4. the upload area's hint
def test_the_upload_area_says_where_a_bigger_model_goes_in_one_sentence(monkeypatch, tmp_path):
    from rlxviz.app.controls import ModelControls

    for env in ("", str(tmp_path)):
        monkeypatch.setenv(ALLOWED_DIRS_ENV, env)
        said = where_big_files()
        assert said.startswith("A bigger model is opened by path instead: ") and said.count(":") == 1
        assert said.endswith(".") and ". " not in said.replace("(and its", "").rstrip("."), said  # one sentence
        doc = ModelControls(state=AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)).upload_doc
        assert "Bigger:" not in doc.object and "Big models" not in doc.object, doc.object
        assert re.search(r"\(at most \d+ MB\)\. A bigger model is opened by path instead: ", doc.object), doc.object


# ============================================================ 5. an upload replacing an upload is said
def onnx_model(op: str) -> bytes:
    """A one-node ONNX model (`y = op(x)`, f32[2, 8])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    m = helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString()


@pytest.mark.slow  # four ONNX loads in the isolated child process, each checked against ONNX Runtime
def test_an_upload_or_a_path_replacing_another_names_the_new_model(monkeypatch, tmp_path):
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    for name, op in (("first.onnx", "Sigmoid"), ("second.onnx", "Tanh")):
        (tmp_path / name).write_bytes(onnx_model(op))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.load_upload({"sigmoid.onnx": onnx_model("Sigmoid")})
    assert s.message.startswith("Now showing sigmoid (upload), was bert-tiny (built-in)."), s.message
    s.load_upload({"deit.ortopt.onnx": onnx_model("Tanh")})
    assert s.model.name == "deit.ortopt"
    assert s.message.startswith("Now showing deit.ortopt (upload), was sigmoid (upload). "
                                "On random inputs (seed 0): version 0"), s.message
    s.load_upload({"deit.ortopt.onnx": onnx_model("Tanh")})  # the same file again: nothing replaced
    assert "Now showing" not in s.message, s.message
    s.param.update(checkpoint_dir=str(tmp_path / "first.onnx"), source="checkpoint")
    assert s.message.startswith("Now showing first (path on the server), was deit.ortopt (upload)."), s.message
    s.checkpoint_dir = str(tmp_path / "second.onnx")
    assert s.message.startswith("Now showing second (path on the server), was first (path on the server)."), \
        s.message
    assert s.message.count("Now showing") == 1


# ============================================================ 6. a batch and seq an inputs file set, carried over
def test_a_built_in_shown_after_an_inputs_file_says_the_batch_and_seq_it_kept():
    """A newcomer's roberta inputs set batch 2, seq 8; the next model (minilm, by its Show button) was built at them,
    and the message did not say so. It keeps them (the user's last choice) and says it once, in the switch line."""
    s, view = tiny()
    choose(view, "mine.npz", bert_io(2, 8))
    assert (s.batch, s.seq) == (2, 8)
    s.param.update(source="preset", preset="llama-block")  # one built-in after another: said only for the shapes
    assert s.model.graph.inputs[0].shape[:2] == (2, 8)
    assert s.message == "Now showing llama-block at batch 2, seq 8 (kept from bert-tiny's inputs).", s.message
    s.preset = "bert-tiny"  # said once: the next switch is as before
    assert "kept from" not in s.message, s.message


@pytest.mark.parametrize("by_hand", [{"seq": 12}, {"batch": 3}])
def test_a_batch_or_seq_set_by_hand_after_the_file_is_not_said_to_be_kept(by_hand):
    s, view = tiny()
    choose(view, "mine.npz", bert_io(2, 8))
    s.param.update(**by_hand)
    s.preset = "llama-block"
    assert "kept from" not in s.message, s.message


def test_a_file_of_the_shown_shape_sets_nothing_so_nothing_is_kept():
    s, view = tiny(batch=2, seq=8)
    choose(view, "mine.npz", bert_io(2, 8))
    used(s, view, "mine.npz")
    s.preset = "llama-block"
    assert "kept from" not in s.message, s.message


def test_the_newcomers_roberta_path_then_show_minilm_says_the_kept_shape(monkeypatch):
    """The issue as found: roberta.onnx by path, roberta_io.npz as inputs (batch 2, seq 8), then the built-in list's
    Show: the switch line says the shape the new model was built at, and where it came from."""
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(CASES))
    s, view = tiny()
    s.param.update(checkpoint_dir=str(CASES / "roberta.onnx"), source="checkpoint")
    assert s.model.name == "roberta", s.message
    choose(view, "roberta_io.npz", (CASES / "roberta_io.npz").read_bytes())
    assert (s.batch, s.seq) == (2, 8) and s.model.name == "roberta", s.message
    s.param.update(source="preset", preset="llama-block")
    assert s.message.startswith("Now showing llama-block (built-in) at batch 2, seq 8 (kept from roberta's inputs), "
                                "was roberta (path on the server)."), s.message
