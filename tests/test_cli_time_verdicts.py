"""`rlxviz time` reads a run as the app's Timing tab does (one answer to one question): a newcomer's
`rlxviz time minilm --repeat 21` printed "x input 5.91" on a run whose input row had IQR 103.68 ms on a 40.58 ms
median, with no busy verdict and no fusion / kernels split, while the app showed "Busy machine: unusable run: ..."
and "Fusion or kernels?" for the same measurement. Now the CLI prints the session's busy check before the table, reads
no ratio of a busy run ("busy: not read"), and on the CPU the split of the final version timed in the same rounds
(`session.lowerings.fusion_and_kernels_of`), in text and in `--json`."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from clirun import run

from rlxviz.app.timeproc import force_busy
from rlxviz.cli.timing import busy_verdict, split_json, split_text
from rlxviz.session import VersionTiming, busy_warning, format_timings
from rlxviz.session import timing as session_timing
from rlxviz.session.lowerings import FUSION_LABELS, fusion_and_kernels_of
from rlxviz.session.timing import NOT_READ, OWN_LOWERING_LABEL

TIME = ("time", "bert-tiny", "--seq", 8, "--repeat", 3, "--warmup", 0, "--no-battery", "--device", "cpu")


def timed(i: int, label: str, samples, nodes: int = 10) -> VersionTiming:
    s = [float(x) for x in samples]
    q1, q3 = np.percentile(s, [25, 75])
    return VersionTiming(i, label, nodes, median_ms=float(np.median(s)), min_ms=min(s), first_call_ms=5.0,
                         max_abs=1e-7, err_unfused=1e-7, ok=True, iqr_ms=float(q3 - q1), samples_ms=tuple(s))


def run_rows(seed: int, rounds: int = 21, speed: float = 0.3) -> tuple[list[VersionTiming], VersionTiming]:
    """A quiet run: the input, an unchanged version, the fused final version and its own-lowering row."""
    base = 10 + np.random.default_rng(seed).random(rounds)
    rows = [timed(0, "input", base), VersionTiming(1, "after dead_code_elimination", 10, same_as=0),
            timed(2, "after fuse_layer", base * speed, 2)]
    return rows, timed(3, OWN_LOWERING_LABEL, base * 0.6, 2)


@pytest.mark.parametrize("seed,speed", [(1, 0.3), (2, 0.5)])
def test_a_quiet_split_reads_its_verdicts_and_a_busy_one_none(seed, speed):
    rows, own = run_rows(seed, speed=speed)
    quiet = fusion_and_kernels_of(rows, own)
    text = split_text(quiet)
    assert text.startswith("Fusion or kernels?") and "quiet enough" in text
    assert [ln.split("  ")[0] for ln in text.splitlines()[3:6]] == list(FUSION_LABELS)
    assert f"fusion: {quiet.fusion.ratio:.2f}x" in text and quiet.fusion.words in text
    assert f"kernels: {quiet.kernels.ratio:.2f}x" in text and quiet.kernels.words in text
    assert f"final version's {quiet.total.ratio:.2f}x over the input" in text
    busy_rows, busy_own = force_busy(rows), force_busy([own])[0]
    busy = fusion_and_kernels_of(busy_rows, busy_own)
    assert busy.warning and busy.warning == busy_warning(busy_rows[0], busy_rows[2], busy_own)
    text = split_text(busy)
    assert f"busy machine: {busy.warning}" in text and "faster" not in text and "slower" not in text
    assert text.count(NOT_READ) == 2
    doc = split_json(busy)
    assert doc["busy"] == busy.warning and {doc[k]["verdict"] for k in ("fusion", "kernels", "total")} == {NOT_READ}
    assert split_json(None) is None and split_json("ValueError: x") == {"not_measured": "ValueError: x"}


@pytest.mark.parametrize("seed", [3, 4])
def test_a_busy_table_reads_no_ratio_not_even_the_inputs_own(seed):
    rows, own = run_rows(seed)
    rows = [r if r.same_as is not None else replace(r, speedup=rows[0].median_ms / r.median_ms) for r in rows]
    plain = format_timings(rows).splitlines()
    assert NOT_READ not in "\n".join(plain) and f"{rows[2].speedup:.2f}" in plain[3].split()  # a quiet run: read
    table = format_timings(rows, busy="unusable run: ...").splitlines()
    # the input's own cell reads the same word: its "1.00" under "no speed-up is printed" was one printed
    assert NOT_READ in table[1] and f"{rows[0].speedup:.2f}" not in table[1].split()
    assert NOT_READ in table[3] and f"{rows[2].speedup:.2f}" not in table[3].split()
    end = table[0].index("x input") + len("x input")  # the column widened, still aligned
    assert table[3].index(NOT_READ) + len(NOT_READ) == end == table[1].index(NOT_READ) + len(NOT_READ)
    assert busy_verdict("").strip() == "" and busy_verdict("w").startswith("Busy machine: w. ")


def _spy(monkeypatch, busy: bool) -> list:
    """Record what `session.timing.time_versions_and_own` returned to the CLI; with `busy`, the run as a busy
    machine leaves it (`app.timeproc.force_busy`, the app's forced-busy hook)."""
    seen: list = []
    real = session_timing.time_versions_and_own

    def spy(*a, **k):
        rows, own = real(*a, **k)
        if busy:
            rows = force_busy(rows)
            own = force_busy([own])[0] if isinstance(own, VersionTiming) else own
        seen.append((rows, own, a[0]))  # a[0]: the trace timed
        return rows, own

    monkeypatch.setattr(session_timing, "time_versions_and_own", spy)
    return seen


def test_a_forced_busy_run_says_so_first_and_reads_no_ratio(capsys, monkeypatch):
    seen = _spy(monkeypatch, busy=True)
    code, out, err = run(capsys, *TIME)
    assert code == 0, err  # a busy run is not a failure
    rows, own, _ = seen[-1]
    warning = busy_warning(*(r for r in rows if r.same_as is None), own)
    assert warning.startswith("unusable run: median")
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith(" #  version"))
    assert lines[head - 1] == busy_verdict(warning)  # the verdict right before the table
    assert "faster" not in out and "slower" not in out
    timed_lines = [ln for ln in lines[head + 2:] if ln[:2].strip().isdigit() and "unchanged" not in ln]
    assert timed_lines and all(NOT_READ in ln for ln in timed_lines)
    assert NOT_READ in lines[head + 1]  # the input's own row: no "1.00" on a busy run either
    assert "Fusion or kernels?" in out and out.count(NOT_READ) == len(timed_lines) + 3
    code, out, err = run(capsys, *TIME, "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows, own, _ = seen[-1]
    assert doc["busy"] == busy_warning(*(r for r in rows if r.same_as is None), own) != ""
    assert {v["vs_input"] for v in doc["versions"][1:] if v["same_as"] is None} == {NOT_READ}
    assert doc["split"]["busy"] == doc["busy"] and doc["split"]["kernels"]["verdict"] == NOT_READ
    # no bare ratio a script would read: the text and the app print none (the medians in ms stay)
    assert all(v["speedup"] is None for v in doc["versions"]) and all(v["median_ms"] for v in doc["versions"]
                                                                      if v["same_as"] is None)
    assert all(doc["split"][k]["ratio"] is None for k in ("fusion", "kernels", "total"))


def test_a_real_run_prints_the_sessions_split(capsys, monkeypatch):
    seen = _spy(monkeypatch, busy=False)
    code, out, err = run(capsys, *TIME, "--json")
    assert code == 0, err
    rows, own, trace = seen[-1]
    split = fusion_and_kernels_of(rows, own, trace.input)
    doc = json.loads(out)
    assert [r["run"] for r in doc["split"]["rows"]] == list(FUSION_LABELS)
    assert [r["median_ms"] for r in doc["split"]["rows"]] == [round(r.median_ms, 4) for r in split.rows]
    for step in ("fusion", "kernels"):  # a ratio only where the text prints one (not busy, medians agreeing)
        v = getattr(split, step)
        want = None if split.warning or v.words == session_timing.DISAGREE else round(v.ratio, 4)
        assert doc["split"][step]["ratio"] == want
    assert doc["busy"] == split.warning == doc["split"]["busy"]
    # the split's input and final rows are the table's own rows: one measurement
    assert doc["split"]["rows"][0]["median_ms"] == round(doc["versions"][0]["median_ms"], 4)
    final = next(v for v in reversed(doc["versions"]) if v["same_as"] is None)
    assert doc["split"]["rows"][2]["median_ms"] == round(final["median_ms"], 4)
    code, out, err = run(capsys, *TIME)
    assert code == 0, err
    rows, own, trace = seen[-1]
    assert out.rstrip("\n").endswith(split_text(fusion_and_kernels_of(rows, own, trace.input)).rstrip("\n"))
    # bert-tiny is built with an attention op: where its input row ran rlxviz's kernel, the split says so
    ran = ", ran " in rows[0].context.kernels
    assert ("input, MLX's own lowering except attention (on rlxviz's kernels)" in out) == ran, out
    assert ("Busy machine: " in out) == bool(busy_warning(*(r for r in rows if r.same_as is None), own))


def test_no_split_skips_the_extra_row(capsys, monkeypatch):
    seen = _spy(monkeypatch, busy=False)
    code, out, err = run(capsys, *TIME, "--no-split", "--json")
    assert code == 0, err
    assert seen[-1][1] is None and json.loads(out)["split"] is None
    code, out, err = run(capsys, *TIME, "--no-split")
    assert code == 0 and "Fusion or kernels?" not in out


@pytest.mark.parametrize("ran,ops", [("rlxviz CPU kernels: cached (avx512, 2 threads), ran attention", ("attention",)),
                                     ("rlxviz CPU kernels: cached (avx512, 2 threads), none ran (no fused op they "
                                      "take)", ()),
                                     ("", ())])
def test_the_split_names_an_input_op_that_ran_on_rlxviz_kernels(ran, ops):
    from rlxviz.models import load_model
    from rlxviz.runtime.timing import TimingContext

    graph = load_model("bert-tiny").graph  # built with an attention op (and so its input may run the kernel)
    rows, own = run_rows(3)
    ctx = TimingContext("cpu", "f32", "openblas", "0.0", 1, kernels=ran)
    rows = [replace(r, context=ctx) if r.same_as is None else r for r in rows]
    split = fusion_and_kernels_of(rows, own, graph)
    assert split.input_kernel_ops == ops
    named = "input, MLX's own lowering except attention (on rlxviz's kernels)"
    assert (named in split_text(split)) == bool(ops) and split.label(0) == (named if ops else FUSION_LABELS[0])
    assert split_json(split)["input_kernel_ops"] == list(ops)
    # without the graph (or with one holding no op the kernels take) nothing is named
    assert fusion_and_kernels_of(rows, own).input_kernel_ops == ()


def test_time_says_what_its_x_input_column_is(capsys):
    """Newcomer run 5 read `x input` 1.02 beside a median of 0.51 ms against the input's 0.50 ms as a contradiction:
    the line under the table says the column is the median of paired per-round ratios, not the medians' ratio."""
    from clirun import run

    from rlxviz.cli.timing import X_INPUT_NOTE

    code, out, err = run(capsys, "time", "bert-tiny", "--seq", 8, "--repeat", 1, "--warmup", 0, "--no-battery")
    assert code == 0, err
    lines = out.splitlines()
    table_end = next(i for i, ln in enumerate(lines) if i > 0 and not ln.strip() and "x input" in "".join(lines[:i]))
    assert lines[table_end + 1] == X_INPUT_NOTE and "paired round by round" in X_INPUT_NOTE
