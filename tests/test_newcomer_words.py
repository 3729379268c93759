"""A fresh newcomer run's wording faults, each checked against what the code does: README step ② said the variant
gives h1 "a second user" while the guard says it has 3 and needs exactly 2; the fix of an extra reader that is a
graph output read "reduce_mean (node 43) reads h1 (graph output #1)", as if h1 were the output."""

import re
from pathlib import Path

from clirun import run

from rlxviz.app.start import BREAK_VARIANT

ROOT = Path(__file__).resolve().parent.parent
ORDINALS = {2: "second", 3: "third", 4: "fourth"}


def _step_two() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"2\. \*\*② Break a layer\*\*:(.*?)\n\d\. ", text, re.S).group(1)


def test_readme_step_two_counts_the_users_the_guard_counts(capsys):
    """The README's ② names the user count the guard reports for the variant ② applies (`BREAK_VARIANT`)."""
    code, out, _ = run(capsys, "explain", "bert-tiny", "--seq", 8, "--variant", BREAK_VARIANT, "--layer", 1)
    assert code == 1
    users, needs = map(int, re.search(r"has (\d+) users .*?; needs exactly (\d+)", out).groups())
    assert users == needs + 1  # the variant adds one reader
    words = " ".join(_step_two().split())
    assert "one more user" in words and f"a {ORDINALS[users]}" in words and f"needs exactly {needs}" in words, words
    assert not any(f"a {o} user" in words for n, o in ORDINALS.items() if n != users), words


def _ir(capsys, variant: str, layer: int) -> str:
    code, out, _ = run(capsys, "ir", "bert-tiny", "--seq", 8, "--variant", variant, "--variant-layer", layer)
    assert code == 0
    return out


def _fix(capsys, path: Path, layer: int) -> str:
    code, out, _ = run(capsys, "explain", path, "--layer", layer)
    assert code == 0 and "fused as far as legal" in out, out  # the returned probe keeps h1: the layer op is illegal
    return re.search(r"^\s+fix: (.*)$", out, re.M).group(1)


def test_the_output_number_names_the_reader_that_is_the_output(capsys, tmp_path):
    """The probe is itself graph output #1: the number sits beside it, not beside h1."""
    for layer in (0, 1):
        p = tmp_path / f"direct{layer}.ir"
        p.write_text(_ir(capsys, "extra_h1_user", layer))
        fix = _fix(capsys, p, layer)
        assert re.search(r"reduce_mean \(node \d+, encoder\.layer\.\d\.probe\), graph output #1, "
                         r"reads ln1 \(role h1\): ", fix), fix
        assert "h1 (graph output" not in fix, fix


def test_a_reader_that_feeds_an_output_names_that_output(capsys, tmp_path):
    """The probe's result reaches output #1 through another node: the number goes with that node, named."""
    text = _ir(capsys, "extra_h1_user", 0)
    probe = re.search(r"^  (%\d+) = reduce_mean\(.*@(\S+probe)$", text, re.M)
    last = max(int(i) for i in re.findall(r"^  %(\d+) =", text, re.M)) + 1
    shape = re.search(r"reduce_mean\(.*?: (f32\[[^]]*\])", text).group(1)
    text = re.sub(rf"return (%\d+), {probe.group(1)}\b",
                  f"%{last} = exp({probe.group(1)}) : {shape} @{probe.group(2)}\n  return \\1, %{last}", text)
    p = tmp_path / "through.ir"
    p.write_text(text)
    fix = _fix(capsys, p, 0)
    assert re.search(rf"reduce_mean \(node \d+, [^)]*\) reads ln1 \(role h1\), and its result flows on to graph "
                     rf"output #1, exp "
                     rf"\(node {last}, [^)]*\): ", fix), fix


def _readme_pipeline() -> list[tuple[int, str]]:
    """(version, step) of each row of the README's pipeline table, a row's numbers (`2, 3`, `4–16`) expanded."""
    text = (ROOT / "README.md").read_text().split("## The fusion pipeline", 1)[1]
    table = re.search(r"^\| version \| step \|.*?\n\|---.*?\n((?:\|.*\n)+)", text, re.M).group(1)
    out = []
    for row in table.splitlines():
        numbers, steps = (c.strip() for c in row.strip("|").split("|")[:2])
        nums = []
        for part in numbers.split(","):
            lo, _, hi = part.strip().partition("–")
            nums += range(int(lo), int(hi or lo) + 1)
        names = re.findall(r"`([^`]+)`", steps)
        assert len(nums) == len(names), row
        out += zip(nums, names, strict=True)
    return out


def test_the_readme_pipeline_table_is_the_pipeline_the_app_runs():
    """The README numbered 12 passes 0-11 while the app lists 27 steps (`canonicalize_exported`, 13 `fuse_sdpa/*`
    stages) and numbers them 1-27 ("17: after fuse_sdpa"): the table is the app's steps, numbered as it numbers
    their versions, read from the pipeline the app runs on its built-in model."""
    from test_app_views import tiny

    from rlxviz.app.wording import version_name
    from rlxviz.passes.pipeline import Pipeline

    s = tiny(hide_unchanged=False)
    ran = [st.pass_name for st in s.trace.steps]  # what the app's run made, step by step
    assert ran == [p.name for p in Pipeline.canonical().steps()] == s.canonical_passes()
    readme = _readme_pipeline()
    assert readme == list(enumerate(s.trace.step_names(), 1)), readme  # a second run named `NAME#2`, as the app
    for number, step in readme:  # the app's own label of the version each row names
        k = next(i for i in range(len(s.version_labels)) if s.version_index(i) == number)
        assert version_name(number, s.version_labels[k]) == f"{number}: after {step}", s.version_labels[k]
