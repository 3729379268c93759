"""Bounded fuzzing of the ONNX importer: mutated copies of the project's exports (attributes set to other
integers, initializer dims changed, inputs swapped or dropped, op types replaced, dimensions of the inputs
changed, the serialized bytes truncated or flipped), each loaded as every front end loads it and, when it loads,
run on the reference and on ONNX Runtime. Asserted for every file: it loads and runs (and ONNX Runtime runs it too:
one meaning or none), or fails with a documented error class
(`SessionError` on load, one line: the importer's refusals and the memory budget; a `ValueError` naming a node
at run time), within 10 s. Seeded: a failure reproduces."""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import pytest
from walltime import within

from rlxviz.runtime import run_reference
from rlxviz.session import Limits, SessionError, load

FIX = Path(__file__).parent / "fixtures" / "onnx"
LIMITS = Limits(256, "fuzz")
HANG_S = 10
N_MUTATIONS = int(__import__("os").environ.get("RLXVIZ_FUZZ_N", "25"))
OPS = ["Add", "Mul", "Relu", "Softmax", "Transpose", "Reshape", "Gather", "Concat", "MatMul", "Hardmax",
       "ReduceSum", "Where", "Loop", "RegexFullMatch", "CumSum", "Expand", "Tile"]


def _mutate(m: onnx.ModelProto, rng: random.Random) -> bytes:
    g = m.graph
    kind = rng.choice(["attr", "dims", "inputs", "op", "input_dims", "bytes"])
    nodes = list(g.node)
    if kind == "attr":
        with_ints = [(n, a) for n in nodes for a in n.attribute if a.type in (2, 7)]  # INT, INTS
        if with_ints:
            n, a = rng.choice(with_ints)
            if a.type == 2:
                a.i = rng.choice([-100, -5, -1, 0, 1, 3, 40, 1 << 40])
            else:
                a.ints[:] = [rng.randint(-6, 6) for _ in range(rng.randint(0, 6))]
    elif kind == "dims" and g.initializer:
        t = rng.choice(list(g.initializer))
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 3, 1 << 20])
    elif kind == "inputs":
        n = rng.choice(nodes)
        if n.input:
            if rng.random() < 0.5:
                del n.input[rng.randrange(len(n.input))]
            else:
                n.input[rng.randrange(len(n.input))] = rng.choice(nodes).output[0]
    elif kind == "op":
        rng.choice(nodes).op_type = rng.choice(OPS)
    elif kind == "input_dims":
        dims = g.input[0].type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 7, 100_000])
    data = m.SerializeToString()
    if kind == "bytes":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b[: rng.randrange(len(b) // 2, len(b) + 1)])
    return data


def _ort_accepts(path: Path, feeds: dict, what: str) -> None:
    """ONNX Runtime builds a session for the file rlxviz imported and runs it on the same inputs (issue 40: a file
    imported under another meaning than ONNX Runtime's, or one it refuses, must not import)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})
    except Exception as e:  # noqa: BLE001 - any refusal of ORT's is the failure reported
        pytest.fail(f"{what}: rlxviz imported it, ONNX Runtime refuses it: {str(e).splitlines()[0][:300]}")


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_mutated_exports_load_or_fail_with_one_documented_error(tmp_path, name):
    base = onnx.load(FIX / f"{name}.onnx").SerializeToString()
    rng = random.Random(f"onnx-fuzz-{name}")
    outcomes = {"loaded": 0, "refused": 0, "run refused": 0}
    for k in range(N_MUTATIONS):
        m = onnx.ModelProto()
        m.ParseFromString(base)
        p = tmp_path / f"m{k}.onnx"
        p.write_bytes(_mutate(m, rng))
        try:
            with within(HANG_S, f"mutation {k} of {name}: the import"):
                model = load(str(p), 1, 4, limits=LIMITS)  # as every front end loads a file: the budget checked
        except SessionError as e:
            assert "\n" not in str(e), str(e)
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        feeds = model.random_feeds(seed=k)
        _ort_accepts(p, feeds, f"mutation {k} of {name}")  # one meaning: what rlxviz imports, ONNX Runtime runs
        try:
            with within(HANG_S, f"mutation {k} of {name}: the run"):
                run_reference(model.graph, feeds, model.weights)
        except ValueError as e:  # a gather past its table, a host op refusing its inputs: named, one line
            assert "\n" not in str(e) and ("gather" in str(e) or "onnx_op" in str(e)), str(e)
            outcomes["run refused"] += 1
    assert outcomes["refused"] and outcomes["loaded"], outcomes  # the mutations reach both outcomes
