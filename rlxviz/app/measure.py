"""`Measurements`: the measuring jobs of an `AppState`, which holds them (`state.measurements`; no Panel import): timing
every version in the timing process, the per-node overlay, and the input arrays a user brings for them. Each job runs
on the state's `Runner`; its state changes are made on the page's thread (`Runner.on_page`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import param

from .. import session
from ..models import Model
from ..passes import Trace
from ..runtime.battery import EXPECTED_PREFIX
from ..session import Limits, SessionError
from ..session.timing_text import kernel_rows
from . import timeproc
from .wording import hide_server_paths, timing_hint

OVERLAY_TIME_LIMIT_S = 60.0
"""Wall time one overlay measurement may take in the timing process; past it the figures measured so far show."""

TIMING_RUNS = session.cache.LRUCache(maxsize=16)
"""The last timing runs (`timeproc.WorkerTiming`) by (trace key, data digest, repeat), for all sessions:
"Time every version" shows them, "Time again" measures anew."""


def measured_when(at: float) -> str:
    """`HH:MM UTC` of a measurement's end (`WorkerTiming.measured_at`, seconds since the epoch)."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M UTC")


def reuse_note(run: timeproc.WorkerTiming, token: str, now: float | None = None) -> str:
    """What the Timing tab says next to a stored run it shows instead of measuring (`TIMING_RUNS`), as Markdown:
    "Stored result, not a new measurement: measured 03:24 UTC (12 min ago, in another session); ↻ Time again
    measures anew." `token`: the showing session's (`Measurements.token`): its own earlier run reads "earlier in
    this session". `now`: seconds since the epoch (default `time.time()`)."""
    now = time.time() if now is None else now
    where = "earlier in this session" if run.session and run.session == token else "in another session"
    if not run.measured_at:
        when = f"measured earlier ({where})"
    else:
        minutes = max(0, int((now - run.measured_at) // 60))
        ago = ("under a minute ago" if minutes < 1 else f"{minutes} min ago" if minutes < 120
               else f"{minutes // 60} h {minutes % 60} min ago")
        when = f"measured {measured_when(run.measured_at)} ({ago}, {where})"
    return (f"**Stored result, not a new measurement:** {when}; the busy-machine verdict and every figure below are "
            "from then. **↻ Time again** measures anew.")


OVERLAY_RUNS = session.cache.LRUCache(maxsize=32)
"""Per-node figures (`session.overlays.NodeFigures`) by (trace key, version index, kind, data digest, device), for
all sessions: stepping back to a measured version shows its colours at once."""


class Measurements:
    """Timing and overlay jobs of one `AppState` (`state.measurements`): the state gives them its parameters, its
    runner and its status calls."""

    def __init__(self, state: param.Parameterized) -> None:
        """`state`: the `AppState` whose measurements these are."""
        self.state = state
        # the run last timed, its rows and the rows timed in the same rounds that are no version (`_time_job`)
        self._timed: tuple[Trace, list, list, frozenset[int]] | None = None
        self.token = uuid.uuid4().hex[:12]
        self._pending: tuple[bytes, str, tuple[int, int], str] | None = None
        """An inputs file waiting for the load its batch and sequence length started: (bytes, file name, (batch, seq),
        the message before), applied by `apply_pending`."""
        """This session's mark on the runs it measures (`WorkerTiming.session`, `reuse_note`)."""

    def time_all(self, fresh: bool = False) -> None:
        """Time every version on MLX (a job with progress); fills `timings` and `blas`.

        Args:
            fresh: measure again even when this model, pipeline and setting were timed before.
        """
        self.state.runner.submit("time", lambda: self._time_job(fresh))

    def _time_job(self, fresh: bool = False) -> None:
        """Time in the timing process; the state changes are made on the page's thread (`Runner.on_page`)."""
        s = self.state
        page = s.runner.on_page
        if s.trace is None or s.model is None:
            page(lambda: s._error("Nothing to time yet: load a model and run the pipeline first.", kind="warning"))
            return
        page(lambda: s._start(f"Timing every version on MLX in the timing process ({s.repeat} interleaved "
                              "rounds)… (the page holds still meanwhile: an animation would take CPU time from "
                              "the measurement)", still=True))
        page(lambda: s.param.update(timing_running=True))  # the tab marks the figures it still shows as the last run's
        trace, model = s.trace, s.model  # one consistent pair, even if a reload is queued
        try:
            Limits.resolve().check(model.graph, model.name, "time")  # what timing holds, as `rlxviz time` checks
            user = s.user_inputs if self._inputs_fit(model) else None
            feeds = user.feeds if user is not None else session.feeds(model, s.text)
            # the user's arrays first, then the battery; the first set named by what it is (`text`: the box tokenized)
            base = session.inputs.feeds_kind(model, s.text) if user is None else None
            sets = session.input_sets(model.graph, feeds, user, base=base)
            key = ("timing", trace.key, session.timing.arrays_digest(feeds, model.weights), user is not None,
                   s.warmup, s.repeat, s.device)
            run = None if fresh else TIMING_RUNS.get(key)
            # a stored run (this session's or another's) says when it was measured, next to its figures (issue 39:
            # a fresh session showed another's 12-minute-old busy verdict in 0.9 s as if just measured)
            origin = reuse_note(run, self.token) if run is not None else ""
            if run is None:
                run = TIMING_RUNS.put(key, replace(
                    timeproc.time_in_worker(trace, feeds, model.weights, warmup=s.warmup, repeat=s.repeat,
                                            device=s.device, inputs=sets), session=self.token))
            when = measured_when(run.measured_at) if origin and run.measured_at else ""
            policy = next((r.policy for r in run.rows if r.policy is not None), None)
            where = next((r.context for r in run.rows if r.context is not None), None)
            # device, precision policy (f32 / TF32), BLAS and its threads, and where the timing ran
            # the own-lowering row shares the versions' rounds: one machine check over all of them
            also = [run.split.rows[1]] if isinstance(run.split, session.FusionAndKernels) and run.split.shared else []
            kernels = kernel_rows(trace, run.rows)
            self._timed = (trace, run.rows, also, kernels)
            page(lambda: s.trace is trace and s.param.update(  # not over a newer run's tab
                timing_policy=(policy.describe() + "\n\n" + policy.ok_rule() + "\n\n" if policy else "")
                + sets.describe(),
                # the BLAS library by its file name, not its path on the server (issue 39)
                blas=hide_server_paths(f"{where if where is not None else 'MLX'}; {s.repeat} interleaved round(s) "
                                       f"per version, in a worker process (pid {run.pid}): the rounds `rlxviz time "
                                       f"--repeat {s.repeat}` runs, here on the inputs this tab lists, the first "
                                       f"{sets.sets[0].name}: {sets.sets[0].what} (the CLI's first is random inputs "
                                       "unless --inputs names a file)"),
                timings=s._timing_rows(run.rows, s._visible(trace), also, kernels), timing_split=run.split,
                # in the same update as the new figures: cleared by a later call, the new run's verdict read
                # "Previous run:" under the under-way banner until then (about a second in the browser)
                timing_origin=origin, timing_when=when, timing_running=False))
        except Exception as e:  # noqa: BLE001
            text = f"Timing failed: {type(e).__name__}: {e}\n{timing_hint(e)}"
            page(lambda: s._error(text))
        finally:
            page(lambda: s.param.update(timing_running=False))
            page(s._stop)

    def measure_overlay(self) -> None:
        """Fill `node_figures` for the shown version and the chosen `overlay` (none: clear them): from
        `OVERLAY_RUNS`, else measured as a job in the timing process (`timeproc.figures_in_worker`: the memory
        budget checked first, a time limit between nodes)."""
        s = self.state
        if s.overlay == "none" or s.trace is None or s.model is None:
            s.param.update(node_figures=None, overlay_status="")
            return
        key = self._overlay_key()
        hit = OVERLAY_RUNS.get(key)
        if hit is not None:
            s.param.update(node_figures=hit, overlay_status=hit.note)
            return
        s.param.update(node_figures=None, overlay_status="measuring…")
        s.runner.submit("overlay", lambda: self._overlay_job(key))

    def _overlay_key(self) -> tuple:
        s = self.state
        model = s.model
        user = s.user_inputs if self._inputs_fit(model) else None
        feeds = user.feeds if user is not None else session.feeds(model, s.text)
        return (s.trace.key, s.version_index(), s.overlay,
                session.timing.arrays_digest(feeds, model.weights), s.device)

    def _overlay_job(self, key: tuple) -> None:
        """Measure in the timing process; the state changes on the page's thread, only if the page still asks
        for this (trace, version, kind)."""
        s = self.state
        page = s.runner.on_page
        trace, model, version, kind = s.trace, s.model, s.version_index(), s.overlay
        what = "time share" if kind == "time" else "error against version 0's reference"
        page(lambda: s._start(f"Measuring each node's {what} in the timing process…", still=kind == "time"))
        try:
            user = s.user_inputs if self._inputs_fit(model) else None
            feeds = user.feeds if user is not None else session.feeds(model, s.text)
            figs = OVERLAY_RUNS.put(key, timeproc.figures_in_worker(
                trace, version, kind, feeds, model.weights, device=s.device, limits=Limits.resolve(),
                time_limit_s=OVERLAY_TIME_LIMIT_S))

            def show() -> None:
                if s.trace is trace and s.version_index() == version and s.overlay == kind:
                    s.param.update(node_figures=figs, overlay_status=figs.note)

            page(show)
        except Exception as e:  # noqa: BLE001 - a refusal or failure is a message
            why = str(e) if isinstance(e, SessionError) else f"{type(e).__name__}: {e}\n{timing_hint(e)}"
            text = f"The {what} overlay failed: {why}"
            page(lambda: (s.param.update(overlay_status="not measured"), s._error(text)))
        finally:
            page(s._stop)

    def set_user_inputs(self, data: bytes | None, filename: str = "inputs.npz") -> None:
        """Use the arrays of an uploaded `.npz` (one per graph input, by name) in the next timing run, or drop them
        (`data=None`). A bad file is a message, never a traceback.

        As `rlxviz time --inputs` does, the file's `input_ids` / `hidden_states` set the batch and sequence length
        (`session.inputs.shape_from_inputs`): when its arrays have the graph's input names but another batch or
        sequence length, those become the sidebar's, the model loads again, and the arrays are used on the new model
        (`apply_pending`; the message says "batch 2 and sequence length 8 set from FILE"). A file that cannot be used
        is refused (`_refuse_inputs`): `inputs_file` is emptied (the Timing tab empties its file box, so choosing the
        same file again is a new choice), and the message says what to set or change.
        """
        s = self.state
        self._pending = None
        if not data:
            s.param.update(user_inputs=None, inputs_file="")
            return
        if s.model is None:
            self._refuse_inputs("Load a model first: its graph decides which input arrays it takes.", filename)
            return
        try:
            self._use_inputs(session.load_inputs(data, s.model.graph, filename), data, filename)
            return
        except ValueError as e:
            refused = str(e)
        try:
            found = session.npz_headers(data, filename)
            headers = {k: v for k, v in found.items() if not k.startswith(EXPECTED_PREFIX)}
            shape = session.inputs.shape_from_inputs(headers, filename)
        except ValueError as e:
            self._refuse_inputs(str(e), filename)
            return
        names = [n.attrs["name"] for n in s.model.graph.inputs]
        if set(headers) != set(names):  # no batch or sequence length would make them fit: the names say why
            extra = [k for k in sorted(headers) if k not in names]
            missing = [repr(k) for k in names if k not in headers]
            why = ([f"unknown input(s) {', '.join(extra)}"] if extra else []) + (
                [f"no array for input(s) {', '.join(missing)}"] if missing else [])
            self._refuse_inputs(f"inputs {filename}: {'; '.join(why)}; the graph takes {', '.join(names)}", filename)
            return
        if shape is None or shape == (s.batch, s.effective_seq):
            self._refuse_inputs(refused, filename)  # another batch or sequence length would not make them fit
            return
        batch, seq = shape
        why = self._shape_unsettable(batch, seq)
        if why:
            self._refuse_inputs(f"{refused} ({filename} has batch {batch} and sequence length {seq}; {why})", filename)
            return
        self._pending = (data, filename, shape, s.message)
        s.inputs_file = filename  # being applied: the file box keeps it while the model loads again
        s.param.update(batch=batch, seq=seq)  # loads the model again; `apply_pending` follows the load
        if not s.autorun:
            s.load()

    def _shape_unsettable(self, batch: int, seq: int) -> str:
        """Why the sidebar cannot take `batch` x `seq` from an inputs file ('' when it can): IR text fixes its own
        shapes; a value past the fields' ranges (`AppState.shape_range`)."""
        s = self.state
        if s.source == "ir":
            return ("IR text fixes its own input shapes, so Batch and Sequence length do not change it: edit the IR's "
                    "input shapes, or make arrays of the shapes it needs")
        for name, value, label in (("batch", batch, "Batch"), ("seq", seq, "Sequence length")):
            lo, hi, reason = s.shape_range(name)
            if not lo <= value <= hi:
                return f"{label} takes {lo}..{hi} ({reason}), so the file cannot be used"
        return ""

    def apply_pending(self) -> None:
        """After the load an inputs file's batch and sequence length started (`set_user_inputs`): use its arrays on
        the model now shown, saying so, or refuse them. Called on the page's thread when the state's latest load job
        ends, loaded or failed (`Runs._load_job`); nothing when no file waits."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        s = self.state
        data, filename, (batch, seq), before = pending
        try:
            if s.model is None or (s.batch, s.seq) != (batch, seq):
                raise ValueError(f"{filename}: the model was not loaded at batch {batch} and sequence length {seq}")
            user = session.load_inputs(data, s.model.graph, filename)
        except ValueError as e:
            self._refuse_inputs(str(e), filename)
            return
        load_said = s.message if s.message != before else ""  # the load's own line (an ONNX file's check) stays
        s._shape_kept = (s.model.name, batch, seq)  # the next model is built at them too: its switch says so
        self._use_inputs(user, data, filename, f"Batch {batch} and sequence length {seq} set from {filename}, as "
                                               f"rlxviz time --inputs takes them.", load_said)

    def _use_inputs(self, user: session.InputSet, data: bytes, filename: str, said: str = "",
                    after: str = "") -> None:
        """Time on `user` next; the message says `said`, that the timing runs on these arrays, version 0 checked on
        them (an ONNX import against its file, and any expected outputs of the file: `session.fidelity.onnx_check`,
        `rlxviz explain --inputs`'s lines, said with the inputs they used), then `after` (the load's own line)."""
        s = self.state
        s.param.update(user_inputs=user, inputs_file=filename)
        expected = [k for k in session.npz_headers(data, filename) if k.startswith(EXPECTED_PREFIX)]
        model = s.model
        checked = model is not None and (bool(user.expected) or bool(model.meta.get("onnx_file")))
        parts = [said] if said else []
        if said or expected or checked:
            parts.append(f"The next timing runs on the arrays of {filename}.")
        tail = [after] if after else []
        kind = "danger" if s.message_kind == "danger" and after else "info"
        if checked:
            on = f" and against its expected output(s) {', '.join(expected)}" if expected else ""
            s.param.update(message=" ".join([*parts, f"Checking version 0 on them{on}…", *tail]), message_kind=kind)
            s.runner.submit("inputs-check", lambda: self._inputs_check_job(model, user, parts, tail, kind))
        elif parts or tail:
            s.param.update(message=" ".join([*parts, *tail]), message_kind=kind)

    def _inputs_check_job(self, model: Model, user: session.InputSet, parts: list[str], tail: list[str],
                          kind: str) -> None:
        """Version 0 on the user's arrays (`Runs.check_inputs`: the ONNX file in a child process, the expected
        outputs), its line put in the message between `parts` and `tail`; nothing when the model or the arrays
        changed meanwhile (a newer choice says its own)."""
        s = self.state
        if s.model is not model or s.user_inputs is not user:  # superseded before it ran
            return
        line, ok = s.runs.check_inputs(model, user)
        line = hide_server_paths(line)

        def show() -> None:
            if s.model is model and s.user_inputs is user:
                s.param.update(message=" ".join([*parts, line.rstrip(".") + ".", *tail]),
                               message_kind=kind if ok else "danger")

        s.runner.on_page(show)

    def _refuse_inputs(self, why: str, filename: str) -> None:
        """Refuse an inputs file: the next timing runs on the model's own inputs, the file's name is dropped (the
        Timing tab empties its file box) and the message says why and that the file is not used."""
        s = self.state
        s.param.update(user_inputs=None, inputs_file="")
        s._error(f"{why.rstrip('.')}. {filename} is not used: the timing runs on the model's own inputs; choose a "
                 "file whose arrays fit (the box is emptied).", kind="warning")

    def _inputs_fit(self, model: Model) -> bool:
        """The uploaded arrays still match `model`'s inputs (the model may have changed since)."""
        s = self.state
        u = s.user_inputs
        if u is None:
            return False
        ok = {n.attrs["name"]: n.shape for n in model.graph.inputs} == {k: v.shape for k, v in u.feeds.items()}
        if not ok:
            s._error("The uploaded input arrays do not fit this model's inputs; timing on its own inputs.",
                     kind="warning")
        return ok

    @staticmethod
    def _timing_rows(rows: list[session.VersionTiming], visible: list[tuple[int, str]],
                     also: list[session.VersionTiming] | None = None,
                     kernels: Collection[int] = ()) -> list[dict[str, Any]]:
        """The timing table's rows for the shown versions (`session.timing.timing_table`: paired verdicts, the
        notebooks' too); `also`: rows timed in the same rounds that are no version (the final version on MLX's own
        lowering), part of the one machine check; `kernels`: indices of the versions lowered with rlxviz's CPU
        kernels (`session.timing_text.kernel_rows`): their `lowering` reads "rlxviz kernels" (the chart and the table
        mark them), and the row where it changes says so (`lowering_change`), as `rlxviz time` reads them."""
        return session.timing_table(rows, visible, also or (), kernels)
