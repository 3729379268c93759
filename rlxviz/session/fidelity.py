"""Does version 0 compute what the model computes? The import check every front end shows.

An importer that changes the numbers is the worst failure of a fusion explorer: every later version is then
compared with a wrong baseline and every check says ok (Falcon imported with max abs error 2.2). So version 0 (the
imported graph, on the NumPy reference interpreter) is compared with the model itself on the same inputs:

* `against_onnx`: the ONNX file run by ONNX Runtime when it is installed, else by onnx's reference evaluator;
* `against_expected`: outputs the user already has (`out:NAME` members of an inputs `.npz`, `--expect`).

Both give a `Fidelity`, judged with the oracle tolerance of the graph's dtype (`runtime.precision`), whose
`line()` the CLI, the app and the notebooks print as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..ir.onnx_op import ort_options, quiet_ort
from ..models import Model
from ..models.onnx.weights import LazyWeights
from ..runtime import run_reference
from ..runtime.battery import InputSet
from ..runtime.compare import close, max_abs
from ..runtime.precision import Tolerance, precision_policy
from .limits import Limits


@dataclass(frozen=True)
class Fidelity:
    """Version 0 against the model itself.

    Attributes:
        against: what it was compared with, in words (`the ONNX model (ONNX Runtime 1.22.0)`).
        outputs: the output names compared.
        max_err: max |version 0 - model| over those outputs (inf: a shape differs; nan: non-finite on one side).
        tol: the tolerance it was judged with.
        ok: every element within `tol` (`|got - want| <= atol + rtol * |want|`), the same inf/nan counting as equal.
        note: why the numbers compared with are the file as written rather than ONNX Runtime's optimized session
            (`optimized_differs`), or "".
        expected: compared with outputs the user gave (`against_expected`), not with the model's own file.
        file_agrees: for `expected`, whether the model's file (`against_onnx`) equalled version 0 on the same inputs
            (`weighed`): True, the expected outputs are not what the file computes; False, the import changed the
            numbers; None, no such check ran, so which of the two is wrong is not known.
        file_runtime: what ran the file in that check (`the ONNX model (ONNX Runtime 1.22.0)`), "" when none ran.
    """

    against: str
    outputs: tuple[str, ...]
    max_err: float
    tol: Tolerance
    ok: bool
    note: str = ""
    expected: bool = False
    file_agrees: bool | None = None
    file_runtime: str = ""

    def line(self) -> str:
        """One line: `version 0 equals the ONNX model (ONNX Runtime 1.22.0): max err 1.3e-06 on last_hidden_state`.
        A difference blames the import only where that is known: version 0 differs from the model's file, or from
        expected outputs the file's own run does not equal (`file_agrees` False); expected outputs the file's run
        agrees with version 0 against are said not to match the file (another model's outputs, as roberta_io.npz
        given with granite.onnx); with no such run, neither is blamed."""
        outs = ", ".join(self.outputs)
        if self.ok:
            return f"version 0 equals {self.against}: max err {self.max_err:.1e} on {outs}" + (
                f"; {self.note}" if self.note else "")
        differs = f"version 0 DIFFERS from {self.against}: max err {self.max_err:.3g} on {outs} (allowed: {self.tol}); "
        if self.expected and self.file_agrees:
            return differs + (f"{self.file_runtime} equals version 0 on these inputs, so the import did not change the "
                              "numbers: the expected outputs do not match what the file computes (are they this "
                              "model's outputs?)")
        if self.expected and self.file_agrees is None:
            return differs + ("which of the two is wrong is not known (nothing else ran the model on these inputs): "
                              "the import may have changed the numbers, or these are not this model's outputs; no "
                              "later check can be trusted until they agree")
        return differs + "the import changed the numbers, so no later check can be trusted"


@dataclass(frozen=True)
class Unchecked:
    """Version 0 not compared with the model, and why (one clause): its weights were left in their file
    (`models.onnx.weights`) and reading them would pass the memory limit. `ok` is True: nothing was found wrong;
    the line says what was not checked."""

    why: str
    ok: bool = True

    def line(self) -> str:
        return f"version 0 not checked against the ONNX model: {self.why}"


SLICE_HINT = "check a slice of the model that fits: --layers 0-1 (rlxviz run / time)"
"""What a refusal for a model whose weights do not fit suggests instead."""


def unread_weights(model: Model, workload: str = "run", limits: Limits | None = None) -> str | None:
    """Why `model`'s weights cannot all be read for `workload` under the memory limit (`limits`, default
    `Limits.resolve()`: the command's own, so `--max-memory-mb` counts here too), in one clause, or None when they
    can, or when none was left in its file (an ordinary model: the command's own check decides). Reads nothing."""
    from ..ir.memory import workload_peak
    from ..models.onnx.weights import LazyWeights
    from .limits import human_bytes

    w = model.weights
    if not isinstance(w, LazyWeights) or not w.pending_bytes():
        return None
    limits = limits or Limits.resolve()
    need = workload_peak(model.graph, workload)[0]
    if need <= limits.max_bytes:
        return None
    return (f"its weights ({human_bytes(w.lazy_bytes())}) were left in their file: a run needs {human_bytes(need)}, "
            f"over the limit of {human_bytes(limits.max_bytes)} ({limits.source}); {SLICE_HINT}")


def output_names(model: Model) -> list[str]:
    """The model's output names: the ONNX graph's for an import, else `last_hidden_state`, `output_1`, ...
    (the names `rlxviz run` saves)."""
    names = model.meta.get("onnx_outputs") if model.meta else None
    if names and len(names) == len(model.graph.outputs):
        return list(names)
    return ["last_hidden_state", *[f"output_{i}" for i in range(1, len(model.graph.outputs))]]


def _judge(model: Model, got: Sequence[np.ndarray], want: Sequence[np.ndarray], names: Sequence[str],
           against: str) -> Fidelity:
    tol = precision_policy(model.graph, "cpu").oracle
    got, want = list(got), list(want)
    return Fidelity(against, tuple(names), max_abs(got, want, same_nonfinite=True), tol,
                    close(got, want, tol, same_nonfinite=True))


def against_expected(model: Model, feeds: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                     source: str) -> Fidelity:
    """Version 0 on `feeds` against `expected` (output name -> array), e.g. an exporter's own outputs.

    Raises:
        ValueError: an expected name that is not an output of the model (names both), or a shape that differs.
    """
    names = output_names(model)
    unknown = sorted(set(expected) - set(names))
    if unknown:
        raise ValueError(f"{source}: out:{unknown[0]} names no output of the model (its outputs: {', '.join(names)})")
    got = run_reference(model.graph, feeds, model.weights)
    pick = [i for i, n in enumerate(names) if n in expected]
    for i in pick:
        if tuple(np.shape(got[i])) != tuple(np.shape(expected[names[i]])):
            raise ValueError(f"{source}: out:{names[i]} has shape {list(np.shape(expected[names[i]]))}, the model's "
                             f"output is {list(np.shape(got[i]))}")
    fid = replace(_judge(model, [got[i] for i in pick], [expected[names[i]] for i in pick],
                         [names[i] for i in pick], f"the expected outputs in {source}"), expected=True)
    if fid.ok or not (path := model.meta.get("onnx_file") if model.meta else None):
        return fid
    # Outputs of ONNX Runtime's optimized session on a file whose meaning that session changes (QDQ fusions):
    # version 0 is judged against the file as written, and the line says why (both errors given).
    runs = _ort_both(path, feeds, [names[i] for i in pick])
    if runs is None:
        return fid
    optimized, plain, who = runs
    want = [expected[names[i]] for i in pick]
    saved_opt = _judge(model, want, optimized, [names[i] for i in pick], "")
    as_written = _judge(model, [got[i] for i in pick], plain, [names[i] for i in pick], "")
    if not (saved_opt.ok and as_written.ok):
        return fid
    note = (f"{source} holds ONNX Runtime's optimized outputs, {fid.max_err:.3g} away: "
            f"{optimized_differs(path)}")
    return Fidelity(f"the ONNX model as written ({who}, graph optimizations off)", as_written.outputs,
                    as_written.max_err, as_written.tol, True, note, expected=True)


def optimized_differs(path: str | Path) -> str:
    """Why ONNX Runtime's optimized session computes other numbers than the file as written, in one clause."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    ops = {n.op_type for n in m.graph.node}
    if "QuantizeLinear" in ops and "DequantizeLinear" in ops:
        return ("its QDQ fusions run integer kernels (QLinearMatMul, QLinearAdd, ...) that requantize where the "
                "file's float ops do not round")
    return "its graph optimizations (fusions, reordered float arithmetic) change the numbers the file defines"


def _ort_both(path: str | Path, feeds: Mapping[str, np.ndarray],
              names: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray], str] | None:
    """ONNX Runtime's outputs `names` on `feeds` with its default (optimized) session and with graph optimizations
    off (the file as written), and its name; None without ONNX Runtime or when it refuses either."""
    ort = quiet_ort()
    if ort is None:
        return None
    outs = []
    for level in (None, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        opts = ort_options()
        if level is not None:
            opts.graph_optimization_level = level
        try:
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            outs.append([np.asarray(w) for w in sess.run(list(names), dict(feeds))])
        except Exception:  # noqa: BLE001 - ORT's refusal: nothing to compare with here (against_onnx says it)
            return None
    return outs[0], outs[1], f"ONNX Runtime {ort.__version__}"


def against_onnx(model: Model, feeds: Mapping[str, np.ndarray], limits: Limits | None = None
                 ) -> Fidelity | Unchecked | None:
    """Version 0 against the ONNX file it was imported from (None for a model that is not an ONNX import), run by
    ONNX Runtime when installed, else by `onnx.reference` (slow on large models); `Unchecked` when its weights were
    left in their file and reading them would pass the memory limit (`unread_weights`: `explain` on an 8B export).

    Raises:
        ValueError: ONNX Runtime refuses the file or these inputs (one line, its reason): the model has no
            meaning to compare with, and no other engine is asked in its place (`onnx.reference` accepts files and
            inputs ONNX Runtime refuses: another rank than the file fixes, an initializer with dims [-1, 8]).
    """
    path = model.meta.get("onnx_file") if model.meta else None
    if not path:
        return None
    if (why := unread_weights(model, limits=limits)) is not None:
        return Unchecked(why)
    feeds = dict(feeds)
    names = output_names(model)
    # With weights still in their file, ONNX Runtime runs first and its session (its own copy of every weight) is
    # gone before rlxviz reads them: the two copies are never held at once (an 8B slice: 3.9 GB each).
    later = isinstance(model.weights, LazyWeights) and model.weights.pending_bytes() > 0 and quiet_ort() is not None
    got = None if later else run_reference(model.graph, feeds, model.weights)  # its own errors name the node
    ort = quiet_ort()
    if ort is None:  # not installed: the reference evaluator is the file's runtime
        import onnx
        from onnx.reference import ReferenceEvaluator

        want, who = ReferenceEvaluator(str(path)).run(names, feeds), f"onnx.reference {onnx.__version__}"
        return _judge(model, got, [np.asarray(w) for w in want], names, f"the ONNX model ({who})")
    try:
        sess = ort.InferenceSession(str(path), ort_options(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - InvalidGraph, NotImplemented, Fail: ORT's own verdict on the file
        if got is None:
            run_reference(model.graph, feeds, model.weights)  # rlxviz's own error, when it has one, comes first
        raise ValueError(f"ONNX Runtime {ort.__version__} refuses {Path(path).name} ({_ort_reason(e)}); stopped: "
                         f"it is not run under another engine") from None
    try:
        want = sess.run(names, feeds)
    except Exception as e:  # noqa: BLE001 - InvalidArgument: a rank, a dimension or a dtype the file does not take
        del sess
        if got is None:
            run_reference(model.graph, feeds, model.weights)
        raise ValueError(f"ONNX Runtime {ort.__version__} refuses these inputs for {Path(path).name} "
                         f"({_ort_reason(e)}); stopped: they are not run under another engine") from None
    del sess
    if got is None:
        got = run_reference(model.graph, feeds, model.weights)
    fid = _judge(model, got, [np.asarray(w) for w in want], names, f"the ONNX model (ONNX Runtime {ort.__version__})")
    if fid.ok:
        return fid
    # ONNX Runtime's optimized session may compute other numbers than the file defines (its QDQ fusions run integer
    # kernels): version 0 equal to the file as written (graph optimizations off) is the import's own fidelity.
    runs = _ort_both(path, feeds, names)
    if runs is None:
        return fid
    plain = _judge(model, got, runs[1], names, "")
    if not plain.ok:
        return fid
    note = f"ONNX Runtime's optimized session differs from it by {fid.max_err:.3g}: {optimized_differs(path)}"
    return Fidelity(f"the ONNX model as written ({runs[2]}, graph optimizations off)", plain.outputs, plain.max_err,
                    plain.tol, True, note)


def _ort_reason(e: BaseException) -> str:
    """ONNX Runtime's message in one line, without its `[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :` prefix."""
    text = " ".join(str(e).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    return (text[:300] + "...") if len(text) > 300 else text or type(e).__name__


def import_checks(model: Model, feeds: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray] | None = None,
                  source: str = "", limits: Limits | None = None, with_onnx: bool = True) -> list[Fidelity | Unchecked]:
    """Version 0 against the model itself on `feeds`, the checks `rlxviz time / explain --inputs` print and the
    app's Timing tab shows for an inputs file (one list): the ONNX file it came from (`with_onnx`, `against_onnx`;
    nothing for a model that is no ONNX import), then the expected outputs (`expected`, the `out:NAME` arrays of the
    inputs file named `source`, `against_expected`).

    Raises:
        ValueError: as `against_onnx` and `against_expected` (ONNX Runtime refuses the inputs; an expected output
            that names no output of the model or has another shape).
    """
    out: list[Fidelity | Unchecked] = []
    if with_onnx and (c := against_onnx(model, feeds, limits)) is not None:
        out.append(c)
    if expected:
        out.append(against_expected(model, feeds, expected, source))
    return weighed(out)


def weighed(checks: Sequence[Fidelity | Unchecked]) -> list[Fidelity | Unchecked]:
    """`checks` (one run's, on the same inputs) with every expected-outputs check that differs told what the model's
    file computed there (`Fidelity.file_agrees`, from the check against the file, `against_onnx`): version 0 equal to
    the file blames the expected outputs, not the import (granite.onnx with roberta_io.npz's outputs said "the import
    changed the numbers" while ONNX Runtime equalled version 0). `rlxviz explain / run / time` and the app's check on
    an inputs file (`onnx_check`) read the same lines."""
    file = next((c for c in checks if isinstance(c, Fidelity) and not c.expected), None)
    if file is None:
        return list(checks)
    return [replace(c, file_agrees=file.ok, file_runtime=file.against)
            if isinstance(c, Fidelity) and c.expected and not c.ok else c for c in checks]


RANDOM_INPUTS = "random inputs (seed 0)"
"""The inputs the load's check runs on (`Model.random_feeds(seed=0)`), as `onnx_check` names them."""


def inputs_source(user: InputSet) -> str:
    """The file an `InputSet` of the user's arrays was read from (`inputs granite_io.npz` -> `granite_io.npz`), as
    the expected-outputs line names it (`against_expected`'s `source`)."""
    return Path(user.what.split(" ", 1)[-1]).name


def onnx_check(model: Model, user: InputSet | None = None) -> tuple[str, bool]:
    """`(line, equal)`: version 0 against the model itself, led by the inputs it ran on, and whether it equals; `("",
    True)` where there is nothing to check (no ONNX import and no expected outputs). Without `user`: `against_onnx`
    on `RANDOM_INPUTS` (the app's load). With `user` (an inputs file's arrays, `session.load_inputs`): `import_checks`
    on its arrays and its expected outputs, as `rlxviz explain --inputs FILE` prints them ("On the arrays of
    granite_io.npz: version 0 equals the ONNX model (...): max err 3.6e-07 on last_hidden_state; version 0 equals the
    expected outputs in granite_io.npz: max err 2.4e-07 on last_hidden_state"). A ValueError of the run (a gather
    past its table at these shapes; an expected output of another shape) is its line, not equal. The app runs it in a
    child process (`isolated.check_isolated`)."""
    on = RANDOM_INPUTS if user is None else f"the arrays of {inputs_source(user)}"
    try:
        if user is None:
            checks = [f] if (f := against_onnx(model, model.random_feeds(seed=0))) is not None else []
        else:
            checks = import_checks(model, user.feeds, user.expected, inputs_source(user))
    except ValueError as e:
        return f"On {on}: version 0 could not be checked against the model: {str(e).splitlines()[0]}", False
    if not checks:
        return "", True
    return f"On {on}: " + "; ".join(c.line() for c in checks), all(c.ok for c in checks)


__all__ = ["RANDOM_INPUTS", "SLICE_HINT", "Fidelity", "Unchecked", "against_expected", "against_onnx", "import_checks",
           "inputs_source", "onnx_check",
           "optimized_differs", "output_names", "unread_weights", "weighed"]
