"""A run too noisy to read a ratio from gives no "x faster" / "x slower", in the CLI, its `--json` and the app alike.

A newcomer's bert-tiny runs (21 interleaved rounds) all passed the old busy check (every median within `BUSY_RATIO`
x its minimum), yet the app read "kernels: 0.59x ... 1.70x slower" and `rlxviz time` minutes later "kernels: 1.17x
... within noise"; the input row had median 1.13 ms and IQR 1.33 ms. Now `session.busy_warning` also flags a row
whose IQR is over `NOISY_IQR` x its median, and `session.paired_verdict` reads "within noise" when its 95% interval
spans more than `WIDE_CI` (high / low). Samples are built by hand (no timing here: timings live in `benchmarks/`)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from clirun import run

from rlxviz.app.timingchart import fusion_kernels_markdown, machine_verdict, speedup_label
from rlxviz.cli.timing import busy_verdict, split_json, split_text
from rlxviz.runtime.precision import precision_policy
from rlxviz.runtime.timing import TimingContext
from rlxviz.session import VersionTiming, busy_warning, format_timings, paired_verdict, timing_table
from rlxviz.session import timing as session_timing
from rlxviz.session.lowerings import fusion_and_kernels_of
from rlxviz.session.timing import BUSY_RATIO, NOISY_IQR, NOT_READ, OWN_LOWERING_LABEL, WIDE_CI

CTX = TimingContext("cpu", "f32", "openblas", "0.0", 1)
VERDICT = re.compile(r"\d+\.\d\dx (faster|slower)")


def timed(i: int, label: str, samples, nodes: int = 10) -> VersionTiming:
    """A version timed in `samples` (ms, round order), with the statistics `runtime.timing` would give them."""
    s = [float(x) for x in samples]
    q1, q3 = np.percentile(s, [25, 75])
    return VersionTiming(i, label, nodes, median_ms=float(np.median(s)), min_ms=min(s), first_call_ms=5.0,
                         max_abs=1e-7, err_unfused=1e-7, ok=True, iqr_ms=float(q3 - q1), samples_ms=tuple(s),
                         context=CTX, policy=precision_policy(), speedup=1.0)


def old_rule_quiet(*rows: VersionTiming) -> bool:
    """The busy check before this change: every median within `BUSY_RATIO` x its minimum."""
    return all(r.median_ms <= BUSY_RATIO * r.min_ms for r in rows)


def bimodal(seed: int, low: float, high: float, rounds: int = 21) -> np.ndarray:
    """Rounds that fall in two clusters (a shared machine: some rounds alone, some beside another session's tests),
    shuffled, plus one round between them; `high` under `BUSY_RATIO` x `low`, so the old rule reads them quiet."""
    rng = np.random.default_rng(seed)
    k = (rounds - 1) // 2
    s = np.concatenate([low * (1 + 0.05 * rng.random(k)), high * (1 + 0.05 * rng.random(rounds - 1 - k)),
                        [(low + high) / 2]])
    return rng.permutation(s)


def noisy_run(seed: int) -> tuple[list[VersionTiming], VersionTiming]:
    """The newcomer's case: the input row's median ~1.1 ms with an IQR larger than half of it, the fused rows narrow."""
    base = bimodal(seed, 0.62, 1.15)
    rng = np.random.default_rng(seed + 100)
    rows = [timed(0, "input", base), VersionTiming(1, "after dead_code_elimination", 10, same_as=0),
            timed(2, "after fuse_layer", 0.9 * (1 + 0.02 * rng.random(21)), 2)]
    return rows, timed(3, OWN_LOWERING_LABEL, 0.7 * (1 + 0.02 * rng.random(21)), 2)


def wide_run(seed: int) -> tuple[list[VersionTiming], VersionTiming]:
    """Every row quiet by both row rules, but the rounds anti-correlated, so the paired ratio's interval excludes 1
    and still spans more than `WIDE_CI`: "2.00x faster" would say more than the rounds do."""
    d = np.random.default_rng(seed).permutation(np.linspace(-0.3, 0.3, 21))
    base, fused = 2.0 * (1 + d), 1.0 - d
    rows = [timed(0, "input", base), timed(1, "after fuse_layer", fused, 2)]
    return rows, timed(2, OWN_LOWERING_LABEL, fused * 1.01, 2)


def clean_run(seed: int, speed: float) -> tuple[list[VersionTiming], VersionTiming]:
    """A quiet machine: every row within 10% and the fused version `1 / speed` times faster in every round."""
    rng = np.random.default_rng(seed)
    base = 10 * (1 + 0.1 * rng.random(21))
    rows = [timed(0, "input", base), timed(1, "after fuse_layer", base * speed * (1 + 0.01 * rng.random(21)), 2)]
    return rows, timed(2, OWN_LOWERING_LABEL, base * speed * 1.5 * (1 + 0.01 * rng.random(21)), 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_spread_the_old_rule_passed_is_now_busy(seed):
    rows, own = noisy_run(seed)
    timed_rows = [r for r in (*rows, own) if r.same_as is None]
    inp = rows[0]
    assert old_rule_quiet(*timed_rows)  # the old check said quiet
    assert inp.iqr_ms > NOISY_IQR * inp.median_ms
    warning = busy_warning(*timed_rows)
    assert warning.startswith(f"unusable run: IQR {inp.iqr_ms:.2f} ms") and "#0 input" in warning
    assert paired_verdict(rows[0], rows[2]).warning == warning


@pytest.mark.parametrize("seed", [3, 4])
def test_a_wide_interval_reads_within_noise_even_when_it_excludes_one(seed):
    rows, _ = wide_run(seed)
    assert not busy_warning(*rows)  # each row on its own is quiet
    v = paired_verdict(*rows)
    assert v.low > 1.0 and v.high > WIDE_CI * v.low  # the interval excludes 1 but spans more than WIDE_CI
    assert v.words == "within noise"


@pytest.mark.parametrize("seed,speed", [(5, 0.5), (6, 0.8), (7, 1.6)])
def test_a_narrow_clean_run_keeps_its_factor(seed, speed):
    rows, own = clean_run(seed, speed)
    assert not busy_warning(*rows, own)
    v = paired_verdict(*rows)
    assert v.low <= v.ratio <= v.high <= WIDE_CI * v.low and not v.low <= 1 <= v.high
    want = f"{v.ratio:.2f}x faster" if speed < 1 else f"{1 / v.ratio:.2f}x slower"
    assert v.words == want and abs(v.ratio - 1 / speed) < 0.05


def words_agree_with_interval(v) -> bool:
    """The verdict's words agree with the interval shown: a factor only on a narrow interval that excludes 1."""
    if VERDICT.fullmatch(v.words):
        return not v.low <= 1 <= v.high and v.high <= WIDE_CI * v.low and (v.ratio > 1) == v.words.endswith("faster")
    return True


def fronts(rows: list[VersionTiming], own: VersionTiming) -> dict[str, str]:
    """What each front end shows of one run: the CLI's table and split text, the split's `--json`, the app's banner,
    bar labels and split Markdown."""
    split = fusion_and_kernels_of(rows, own)
    table = timing_table(rows, also=[own])
    busy = table[0]["busy"]
    return {"cli": (busy_verdict(busy) + "\n" + format_timings(rows, busy) + "\n" + split_text(split)),
            "json": json.dumps(split_json(split)), "busy": busy,
            "app": "\n".join([machine_verdict(table)[0], *map(speedup_label, table[1:]),
                              fusion_kernels_markdown(split)]),
            "words": json.dumps([t["vs_input"] for t in table]), "split": split}


@pytest.mark.parametrize("make,busy", [(lambda: noisy_run(0), True), (lambda: noisy_run(1), True),
                                       (lambda: wide_run(3), False), (lambda: clean_run(5, 0.5), False),
                                       (lambda: clean_run(7, 1.6), False)])
def test_cli_json_and_app_read_the_same_samples_alike(make, busy):
    rows, own = make()
    f = fronts(rows, own)
    assert bool(f["busy"]) == busy
    split = f["split"]
    for v in (split.fusion, split.kernels, split.total):
        assert words_agree_with_interval(v)
    doc = json.loads(f["json"])
    if f["busy"]:  # no front end gives a factor
        for k in ("cli", "app"):
            assert "faster" not in f[k] and "slower" not in f[k], k
        assert {doc[k]["verdict"] for k in ("fusion", "kernels", "total")} == {NOT_READ}
        assert f["cli"].startswith("Busy machine: ") and "**Busy machine:" in f["app"]
        return
    assert "Quiet enough" in f["app"] and "quiet enough" in f["cli"]
    for name, v in (("fusion", split.fusion), ("kernels", split.kernels)):
        assert doc[name]["verdict"] == v.words
        assert f"{name}: {v.ratio:.2f}x ({v.low:.2f}-{v.high:.2f})" in f["cli"] and v.words in f["cli"]
        assert f"{name}: {v.ratio:.2f}× ({v.low:.2f}–{v.high:.2f}) | {v.words} |" in f["app"]
    # the table's verdict against the input and the bar's label agree
    t = json.loads(f["words"])[-1]
    assert (t == "within noise") == ("within noise" in f["app"].splitlines()[len(rows) - 1])


@pytest.mark.parametrize("make,busy", [(lambda: noisy_run(2), True), (lambda: clean_run(6, 0.8), False)])
def test_rlxviz_time_text_and_json_read_injected_samples_as_the_app(capsys, monkeypatch, make, busy):
    """`rlxviz time` on bert-tiny with its measurement replaced by hand-built samples: the text's busy line, each
    `vs_input` in `--json` and the app's table read the same."""
    rows, own = make()

    def fake(trace, *a, **k):
        # the hand-built rows first, then every later version unchanged from the last of them
        rest = range(len(rows), len(trace.versions()))
        return [*rows, *(VersionTiming(i, f"v{i}", 1, same_as=rows[-1].index) for i in rest)], own

    monkeypatch.setattr(session_timing, "time_versions_and_own", fake)
    args = ("time", "bert-tiny", "--seq", 8, "--no-battery", "--device", "cpu")
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert bool(doc["busy"]) == busy and doc["split"]["busy"] == doc["busy"]
    code, text, err = run(capsys, *args)
    assert code == 0, err
    assert ("Busy machine: " in text) == busy
    app = fronts(rows, own)
    assert doc["busy"] == app["busy"]
    assert [v["vs_input"] for v in doc["versions"][:len(rows)]] == json.loads(app["words"])
    if busy:
        assert "faster" not in text and "slower" not in text
    else:
        assert doc["versions"][1]["vs_input"] == paired_verdict(rows[0], rows[1]).words
        assert VERDICT.fullmatch(doc["versions"][1]["vs_input"])


def test_the_timing_tabs_legend_states_the_rule_the_verdicts_use():
    """Newcomer run: the Timing tab defined *Within noise* as "that interval holds 1 (or lies within 1 ± 1%)" while
    the verdicts also read a ratio whose interval spans more than `WIDE_CI` as within noise."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView
    from rlxviz.session.timing import PRACTICAL, WIDE_CI

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    s.blas = "OpenBLAS; 3 interleaved round(s) per version"
    legend = view.blas.object
    assert f"within 1 ± {PRACTICAL:.0%}" in legend and f"spans more than {WIDE_CI}x" in legend, legend
