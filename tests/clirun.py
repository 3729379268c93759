"""The CLI in-process for tests: `run` a command, and `one_line` / `one_line_error` for its one-line errors; `rlxviz`
runs it in a subprocess."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from rlxviz import cli

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (a subprocess's working folder)."""
PY = ROOT / ".venv" / "bin" / "python"
"""The project's interpreter, when it has one there (else this one)."""


def rlxviz(*args) -> subprocess.CompletedProcess:
    """`python -m rlxviz ARGS` in a subprocess at the repository root (text output captured, 300 s at most)."""
    return subprocess.run([str(PY if PY.exists() else sys.executable), "-m", "rlxviz", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def run(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `rlxviz ARGS` run in-process (`cli.main`)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def case_trace(source: Path):
    """The canonical run (`passes.Trace`) of a case file (an ONNX export or IR text) as `rlxviz explain FILE
    --inputs NAME_io.npz` opens it: the shapes of its `NAME_io.npz` inputs when it has one (the `out:` arrays
    left out), else the file's own."""
    import numpy as np

    from rlxviz.session import OpenRequest, open_model, open_pipeline, open_trace

    io = source.with_name(source.stem + "_io.npz")
    req = OpenRequest(source=str(source))
    if io.exists():
        with np.load(io) as z:
            req = OpenRequest(source=str(source), input_shapes={k: z[k].shape for k in z.files
                                                                if not k.startswith("out:")})
    return open_trace(open_model(req).graph, req, open_pipeline(req))


def one_line(err: str, command: str, kind: str = "error") -> str:
    """The one line of `err`, which must read `rlxviz COMMAND: KIND: ...` with no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"rlxviz {command}: {kind}: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


def one_line_error(err: str, command: str, fragment: str) -> None:
    """`one_line` of an error that contains `fragment`."""
    assert fragment in one_line(err, command), err


def inject_crash(monkeypatch, pass_name: str) -> None:
    """Make pass `pass_name` raise `RuntimeError("injected failure")` for this test, with no cached run to hide it."""
    import dataclasses

    from rlxviz.passes import PASSES
    from rlxviz.session import pipeline as session_pipeline

    def boom(graph, params):
        raise RuntimeError("injected failure")

    monkeypatch.setitem(PASSES, pass_name, dataclasses.replace(PASSES[pass_name], fn=boom))
    monkeypatch.setattr(session_pipeline, "TRACES", type(session_pipeline.TRACES)(maxsize=4))


def file_inputs(path) -> dict:
    """An .onnx fixture's input shapes from its sibling inputs file (`NAME_io.npz` or `NAME.npz`, `out:NAME` arrays
    left out) when the file leaves a dim a default load cannot bind (a KV cache's `past`, a vision export's
    `height`): what a user passes with `--inputs` after the one-line refusal. {} when a plain load works.

    Decided once per file and process (`_file_inputs`): the answer needs a whole default load (~0.4 s for a zoo
    file), and the sweeps over the zoo (exact claims, printed fixes, verdict parity) each ask for every file. A
    fresh dict each call (its `shapes` too), so a caller's edit reaches no other test."""
    given = _file_inputs(str(path))
    return {k: dict(v) if k == "shapes" else v for k, v in given.items()}


@functools.cache
def _file_inputs(path: str) -> dict:
    """`file_inputs` of the fixture at `path`, computed (the fixtures are read-only)."""
    from pathlib import Path

    import numpy as np

    from rlxviz import session

    p = Path(path)
    if p.suffix != ".onnx":
        return {}
    try:
        session.load(str(p))
        return {}
    except session.SessionError:
        for cand in (p.with_name(p.stem + "_io.npz"), p.with_suffix(".npz")):
            if cand.exists():
                with np.load(cand) as z:
                    return {"npz": cand, "shapes": {k: z[k].shape for k in z.files if not k.startswith("out:")}}
        raise


README_IR = """graph mlp {
  %0 = input {name="x"} : f32[2, 8, 16]
  %1 = param {name="fc.weight"} : f32[16, 32] @fc
  %2 = param {name="fc.bias"} : f32[32] @fc
  %3 = matmul(%0, %1) : f32[2, 8, 32] @fc
  %4 = add(%3, %2) : f32[2, 8, 32] @fc
  %5 = gelu(%4) : f32[2, 8, 32] @fc
  return %5
}
"""
"""The example graph of docs/ir.md (a linear layer and GELU, `@fc` its layer path), as IR text."""


_PLACES = re.compile(r" (?:@|at \d+ places,) [^:]*: (?:at %\d+: )?")


def unplaced(line: str) -> str:
    """A "not expected here" line (`why.policy.not_expected_line`) without the places it names (`@ %N (PATH)`, `at K
    places, %A (P) and %B (P)` and the `at %A: ` before the first place's reason): `RULE (GUARD): REASON; why ...`, for
    tests that read its rule, guard, reason and why (tests/test_chip_places_in_text.py reads the places)."""
    return _PLACES.sub(": ", line, count=1)
