"""The teaching notebooks: stored clean (no outputs, as `notebooks/build.py` writes them from their jupytext sources
`notebooks/src/NN_*.py`) and executed top to bottom with nbclient on this venv's Python; tagged cells' outputs are
checked."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from queue import Empty
from time import monotonic

import jupytext
import nbformat
import pytest
from cpu_default import default_gemm
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from rlxviz.session.timing import BUSY_RATIO, DISAGREE, DISAGREE_CELL, NOISY_IQR, NOT_READ, WIDE_CI

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
KERNEL = "python3"


VERDICT = r"(within noise|" + re.escape(DISAGREE) + r"|\d+\.\d\dx (?:faster|slower))"
"""A printed timing verdict: within noise, not read (`DISAGREE`), or N.NNx faster/slower."""


def _cells(line: str) -> list[str]:
    """A `format_timings` row's cells: the `x input` words that hold spaces (a busy run's `busy: not read`, a
    contradicted ratio's `not read: medians disagree`) kept as one cell, so columns counted from the end stay put."""
    for words in (NOT_READ, DISAGREE_CELL):
        line = line.replace(words, words.replace(" ", "_"))
    return line.split()

def _builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _builder()
NAMES = list(BUILD.NOTEBOOKS)


def test_notebooks_exist_and_match_their_sources():
    """Each stored notebook is jupytext's conversion of its source (cells, tags, metadata), byte for byte."""
    assert NAMES == ["01_what_is_fusion.ipynb", "02_fusing_a_bert_layer.ipynb", "03_why_did_my_layer_not_fuse.ipynb",
                     "04_write_your_own_pattern_and_guard.ipynb", "05_bring_your_own_model.ipynb",
                     "06_a_multi_output_fusion.ipynb"]
    for name in NAMES:
        path = NB_DIR / name
        assert path.read_text(encoding="utf-8") == BUILD.render(name), f"{name} is stale: run notebooks/build.py"
        stored = nbformat.read(path, as_version=4)
        converted = jupytext.read(NB_DIR / "src" / name.replace(".ipynb", ".py"), fmt="py:percent")
        assert [(c.cell_type, c.metadata) for c in stored.cells] == [(c.cell_type, c.metadata) for c in converted.cells]
        assert stored.metadata == {k: v for k, v in converted.metadata.items() if k != "jupytext"}


def test_setup_cell_is_single_sourced():
    """Every notebook's first code cell is `notebooks/src/setup_cell.py`, loaded by its source's `%load` cell."""
    setup = (NB_DIR / "src" / "setup_cell.py").read_text(encoding="utf-8").strip("\n")
    for name in NAMES:
        first = next(c for c in nbformat.read(NB_DIR / name, as_version=4).cells if c.cell_type == "code")
        assert first.metadata["tags"] == ["setup"] and first.source == setup, name


def test_build_names_a_missing_load(tmp_path):
    source = tmp_path / "99_x.py"
    source.write_text('# %% [markdown]\n# # x\n\n# %%\n# %load no_such_cell.py\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"^99_x.py: cell 1 loads no_such_cell.py, which is not in "):
        BUILD.build(source)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_stored_without_outputs(name):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == KERNEL
    assert any("widgets." in c.source for c in code), "each notebook has an ipywidgets control"


def test_kernel_resolves_to_this_python():
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    km = KernelManager(kernel_name=KERNEL)
    cmd = km.format_kernel_cmd()
    assert spec.language == "python"
    assert Path(cmd[0]).resolve() == Path(sys.executable).resolve(), (cmd, sys.executable)


# Wrong answers a student may give, appended (in the test only) after each notebook's last cell and run by the same
# kernel: each exercise check must answer "not yet: ..." with a hint, never a traceback nor "correct".
PROBES = {
    "01_what_is_fusion.ipynb": {
        "probe-single-number": "teach.feedback(check_ex01, 131072);",
        "probe-strings": "teach.feedback(check_ex01, ('131072', '0'));",
        "probe-three": "teach.feedback(check_ex01, (131072, 0, 0));",
        "probe-write-only": "teach.feedback(check_ex01, (65536, 0));",
        "probe-executed-ideal": "teach.feedback(check_ex01, (131072, 131072));",
        "probe-executed-reversed": "teach.feedback(check_ex01, (131072, moved[2].total - moved[1].total));",
    },
    "02_fusing_a_bert_layer.ipynb": {
        "probe-float": "teach.feedback(check_ex02, (49152.5, 12));",
        "probe-matmuls-only": "teach.feedback(check_ex02, (294912, 12));",
        "probe-reads-before": "teach.feedback(check_ex02, (442368, 24));",
    },
    "03_why_did_my_layer_not_fuse.ipynb": {
        "probe-no-return": "def fix_ir(text):\n    text.replace('x', 'x')\n\n\nteach.feedback(check_ex03, fix_ir);",
        "probe-typo": "teach.feedback(check_ex03, lambda text: text.replace('return', 'retrun'));",
        "probe-not-callable": "teach.feedback(check_ex03, ir_text);",
        "probe-keeps-probe": "import re\n\nteach.feedback(check_ex03, lambda text: re.sub(r'return (%\\d+), (%\\d+)', "
                             "r'return \\2', text));",  # returns the probe of h1, drops the model's output
    },
    "04_write_your_own_pattern_and_guard.ipynb": {  # the solutions' rules with one thing wrong each
        "probe-absorb-act-only": "from dataclasses import replace as _replace\n\n"
                                 "_rule = _replace(solutions.ex04b().rules[0], absorb=('act',))\n"
                                 "teach.feedback(check_ex04b, rule_pass('fuse_gelu_tanh_epilogue', [_rule]));",
        "probe-no-size-gate": "_rule = solutions.ex04b().rules[0]\n"
                              "teach.feedback(check_ex04b, rule_pass('fuse_gelu_tanh_epilogue', "
                              "[_replace(_rule, steps=_rule.steps[:2])]));",
        "probe-swap-every-add": "teach.feedback(check_ex04a, rule_pass('canonicalize_add', "
                                "[_replace(solutions.ex04a().rules[0], steps=())]));",
        "probe-swap-keeps-order": "_rule = solutions.ex04a().rules[0]\n"
                                  "teach.feedback(check_ex04a, rule_pass('canonicalize_add', [_replace(_rule, "
                                  "build=lambda c: (Op.ADD, [c.id('a'), c.id('b')], {}))]));",
    },
    "05_bring_your_own_model.ipynb": {
        "probe-every-norm": "teach.feedback(check_ex05, (5, 5, 'sum_single_user'));",
        "probe-activation-guard": "teach.feedback(check_ex05, (1, 1, 'epilogue_activation'));",
        "probe-two-values": "teach.feedback(check_ex05, (1, 1));",
        "probe-transformer-count": "teach.feedback(check_ex05, (1, 4, 'sum_single_user'));",  # the other optimizer
    },
    "06_a_multi_output_fusion.ipynb": {  # the solution's rule with one thing wrong each
        "probe-no-outputs": "from dataclasses import replace as _r\n_s = solutions.ex06().rules[0]\n"
                            "_b = lambda c: (Op.FUSED_RESIDUAL_LN, [c.id(k) for k in ('x', 'residual', 'gamma', "
                            "'beta')], {'eps': c['norm'].attrs['eps']})\n"
                            "teach.feedback(check_ex06, rule_pass('p', [_r(_s, outputs=(), build=_b)]));",
        "probe-norm-only": "teach.feedback(check_ex06, rule_pass('p', [_r(_s, outputs=(), absorb=('norm',), "
                           "build=_b)]));",
        "probe-no-quiet": "teach.feedback(check_ex06, rule_pass('p', [_r(_s, steps=_s.steps[1:])]));",
        "probe-no-same-shape": "teach.feedback(check_ex06, rule_pass('p', [_r(_s, steps=(_s.steps[0], "
                               "_s.steps[2]))]));",
    },
}


class _Client(NotebookClient):
    """nbclient's client whose waits on the kernel's shell and IOPub sockets poll in steps of at most 1 s.

    On a loaded 2-core machine a reply can sit in the client's socket with no wake-up of the event loop (pyzmq's
    asyncio poll on the edge-triggered ZMQ_FD; ipykernel 7.4, pyzmq 27.3): the kernel has run the cell and gone
    idle, IOPub said so, and nbclient still waits on the shell socket until its per-cell timeout (240 s) ends the
    poll, which then finds the reply and goes on without an error. Seen here as cells that took 240.00 s (a 1 s cell
    of 02, a 0.1 s cell of 03) and as the 9 min 42 s runs; a poll that times out re-reads the socket's events, so
    short polls bound each such stall to about a second."""

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = _stepped(channel.get_msg)
        return kc


def _stepped(get_msg, step=1.0):
    async def get(timeout=None):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            left = step if deadline is None else min(step, max(0.0, deadline - monotonic()))
            try:
                return await get_msg(timeout=left)
            except Empty:
                if deadline is not None and monotonic() >= deadline:
                    raise

    return get


def execute(name):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    for tag, source in PROBES.get(name, {}).items():
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    # the kernel's own stdin/stdout/stderr (not the cells' outputs, which come over ZMQ) go to /dev/null: inheriting
    # pytest's captured file descriptors made the first kernel of a session take ~240 s longer to finish
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    _Client(nb, kernel_name=KERNEL, timeout=240, allow_errors=False,
                   resources={"metadata": {"path": str(NB_DIR)}}).execute(**quiet)
    return nb


def tagged(nb):
    """tag -> (stdout text, list of HTML outputs) of the tagged code cells."""
    out = {}
    for c in nb.cells:
        for tag in c.metadata.get("tags", []):
            text = "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream" and o.name == "stdout")
            html = [o.data["text/html"] for o in c.outputs if "data" in o and "text/html" in o.data]
            out[tag] = (text, html)
    return out


@pytest.fixture(scope="module")
def executed():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = execute(name)
        return cache[name]

    return get


def common(nb):
    t = tagged(nb)
    text, _ = t["setup"]
    assert f"python: {sys.executable}" in text  # the kernel is this venv's python
    for c in nb.cells:
        if c.cell_type == "code":
            assert not [o for o in c.outputs if o.output_type == "error"]
        if "widgets.interact(" in c.source:  # a live control, and nothing else printed by the call itself
            kinds = [k for o in c.outputs for k in o.get("data", {})]
            assert "application/vnd.jupyter.widget-view+json" in kinds, kinds
            assert not [o for o in c.outputs if o.output_type == "execute_result"]
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata.get("widgets", {})
    return t


def probe(t, tag):
    """The feedback a probe cell printed: one "not yet" paragraph, no traceback."""
    text, _ = t[tag]
    assert text.startswith("not yet: ") and text.count("\n") == 1 and "Traceback" not in text, (tag, text)
    return text


def test_feedback_reports_any_exception_in_plain_words(capsys):
    from rlxviz import teach

    def check(answer):
        return answer(1).splitlines()  # a function that forgot to return

    assert teach.feedback(check, lambda x: None) is False
    out = capsys.readouterr().out
    assert out.startswith("not yet: checking your answer stopped with AttributeError: 'NoneType' object has no")
    assert out.count("\n") == 1 and "Traceback" not in out
    assert teach.feedback(lambda a: (_ for _ in ()).throw(ValueError("first line\nsecond line")), 0) is False
    out = capsys.readouterr().out
    assert "ValueError: first line." in out and "second line" not in out
    assert teach.feedback(lambda a: "fine", 0) is True and capsys.readouterr().out == "correct: fine\n"


@pytest.mark.parametrize(("answer", "hint"), [
    (131072, "give a tuple of 2 numbers, (ideal, executed); you gave a single int (131072)"),
    ((1, 2, 3), "yours has 3"),
    ((None, 0), "fill in both numbers"),
    (("131072", 0), "ideal: '131072' is text (in quotes); write the number without quotes"),
    ((1.5, 0), "ideal: 1.5 is not a whole number"),
    ((1, True), "executed: give a whole number, not a bool"),
])
def test_expect_ints_names_what_is_wrong(answer, hint):
    from rlxviz import teach

    with pytest.raises(AssertionError) as e:
        teach.expect_ints(answer, ("ideal", "executed"))
    assert hint in str(e.value)


def test_expect_ints_accepts_whole_numbers():
    import numpy as np

    from rlxviz import teach

    assert teach.expect_ints([np.int64(3), 4.0], ("a", "b")) == (3, 4)


def exercise_feedback(nb, t, exercise="exercise", solution="solution"):
    """The exercise stub gets feedback (not a bare boolean); the collapsed solution cell passes the same check."""
    text, _ = t[exercise]
    assert text.startswith("not yet: ") and "True" not in text and "False" not in text
    for tag in (exercise, solution):  # feedback only: no boolean shown as the cell's value
        cell = next(c for c in nb.cells if tag in c.metadata.get("tags", []))
        assert not [o for o in cell.outputs if o.output_type == "execute_result"], tag
    text, _ = t[solution]
    assert text.startswith("correct: ")
    sol = [c for c in nb.cells if solution in c.metadata.get("tags", [])]
    assert sol and all(c.metadata["jupyter"]["source_hidden"] for c in sol)
    assert nb.cells.index(sol[0]) > [i for i, c in enumerate(nb.cells) if exercise in c.metadata.get("tags", [])][0]


def markdown_of(nb, tag):
    """The text/markdown outputs of the cells tagged `tag`."""
    return "".join(o.data["text/markdown"] for c in nb.cells if tag in c.metadata.get("tags", [])
                   for o in c.outputs if "text/markdown" in o.get("data", {}))


def assert_verdict(words, ratio, low, high, eps=0.0005):
    """A printed verdict agrees with its printed ratio and 95% interval (3 decimals, so up to `eps` of rounding):
    within noise when the interval holds 1, lies within 1% of it or spans more than `WIDE_CI` (high / low: too wide
    to read a factor from); otherwise faster/slower as the ratio says."""
    holds_one = low - eps <= 1.0 <= high + eps
    practical = low + eps >= 0.99 and high - eps <= 1.01
    wide = high + eps > WIDE_CI * (low - eps)
    if words == DISAGREE:  # the median ratio and the ratio of medians point opposite ways: nothing read
        return
    if words == "within noise":
        assert (holds_one or low >= 0.99 - eps and high <= 1.01 + eps or abs(ratio - 1) < 0.01 + eps
                or wide), (words, low, high)
    else:
        assert not (low + eps < 1.0 < high - eps) and not practical, (words, low, high)
        assert high - eps <= WIDE_CI * (low + eps), (words, low, high)
        assert abs(ratio - 1) >= 0.01 - eps, (words, ratio)
        assert words.endswith("faster") == (ratio > 1.0), (words, ratio)


RIDGE_HALF = 0.05
"""Half a unit of the ridge as printed (`{ridge:.1f}`): the cell classifies against the unrounded ridge."""


def side(intensity: float, ridge: float, eps: float = 0.0) -> str | None:
    """The bound a printed `ridge` (FLOP/B, 1 decimal) fixes for an op or version of `intensity` (FLOP/B, exact
    or printed to within `eps`): `compute` at or above the ridge, `memory` below it, None where the rounding of
    either leaves it open (the cell compared the unrounded numbers)."""
    if intensity - eps >= ridge + RIDGE_HALF:
        return "compute"
    if intensity + eps < ridge - RIDGE_HALF:
        return "memory"
    return None


def roofline_bounds(text: str) -> tuple[float, list[tuple[str, ...]], list[tuple[str, ...]], dict[str, str]]:
    """Read notebook 01's `roofline` cell: (printed ridge, op rows, version rows, predicted bound per version).

    Asserts what no machine load can change: each op's intensity is its FLOPs over its bytes (the graph's
    shapes), and the printed bounds split ops and versions by intensity at one threshold that the printed ridge
    agrees with up to its rounding. The ridge is measured now: which side an op lands on is shown, not asserted."""
    ridge = float(re.search(r"-> ridge (\S+) FLOP/B", text).group(1))
    ops = re.findall(r"^%(\d+)\s+(\w+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(memory|compute)$", text, re.M)
    versions = re.findall(r"^version (\d) .+?FLOPs (\d+)  bytes executed (\d+) \(ideal (\d+)\)  FLOP/B executed "
                          r"(\S+) \(ideal (\S+)\)$", text, re.M)
    predicted = dict(re.findall(r"^prediction #(\d): (compute|memory)-bound, at best \S+ ms$", text, re.M))
    assert ops and versions and sorted(predicted) == [v[0] for v in versions], text
    points = []  # (intensity, eps, bound)
    for _, _, flops, nbytes, intensity, bound in ops:
        assert abs(float(intensity) - int(flops) / int(nbytes)) < 0.006
        points.append((int(flops) / int(nbytes), 0.0, bound))
    points += [(float(v[4]), 0.005, predicted[v[0]]) for v in versions]
    for intensity, eps, bound in points:
        assert side(intensity, ridge, eps) in (bound, None), (intensity, bound, ridge)
    memory = [i + eps for i, eps, b in points if b == "memory"]
    compute = [i - eps for i, eps, b in points if b == "compute"]
    assert not memory or not compute or max(memory) <= min(compute), points  # one threshold splits them
    return ridge, ops, versions, predicted


def test_roofline_bounds_read_the_printed_ridge_up_to_its_rounding():
    """A ridge measured at 0.98 FLOP/B prints as 1.0: the norm (0.99 FLOP/B) is compute-bound against the
    unrounded ridge (issue: a loaded machine measured such a ridge and the test read `'compute' == 'memory'`).
    A bound on the wrong side of the ridge by more than its rounding, or two bounds no threshold splits, fail."""
    head = "measured on MLX cpu: matmul 9.8 GFLOP/s, one-thread streaming add 10.00 GB/s -> ridge 1.0 FLOP/B\n"
    rows = ["%3     matmul        16777216   589824   28.44  compute",
            "%9     add              16384   131584    0.12  memory",
            "%13    layer_norm      131072   132096    0.99  compute"]
    tail = ("\nversion 0 input  FLOPs 100  bytes executed 102 (ideal 102)  FLOP/B executed 0.98 (ideal 0.98)"
            "\nprediction #0: memory-bound, at best 0.010 ms\n")
    ridge, ops, _, predicted = roofline_bounds(head + "\n".join(rows) + tail)
    assert ridge == 1.0 and [o[5] for o in ops] == ["compute", "memory", "compute"] and predicted == {"0": "memory"}
    with pytest.raises(AssertionError):  # the matmul, 28 FLOP/B, below a ridge of 1.0
        roofline_bounds(head + "\n".join([rows[0].replace("compute", "memory")] + rows[1:]) + tail)
    with pytest.raises(AssertionError):  # the version at 0.98 FLOP/B compute-bound, the norm at 0.99 memory-bound:
        roofline_bounds(head + "\n".join(rows[:2] + [rows[2].replace("compute", "memory")])  # no threshold splits
                        + tail.replace("memory-bound", "compute-bound"))  # them, though each alone may round either way


def test_01_what_is_fusion(executed):
    nb = executed("01_what_is_fusion.ipynb")
    t = common(nb)
    text, _ = t["ir-input"]
    assert text.startswith("graph ffn_block {") and "compute nodes: 7" in text
    text, _ = t["step-fmba"]
    assert "matches: 2 | rejections: 0" in text and "'FusedMatMulBiasAct': 2" in text
    # bytes from the graph: fc1's matmul and add [2, 64, 512] f32 and fc2's matmul [2, 64, 128] f32,
    # each written once and read once
    text, _ = t["traffic-fmba"]
    ideal = 2 * (2 * 2 * 64 * 512 + 2 * 64 * 128) * 4  # fc1's matmul and add, fc2's matmul: 1 write + 1 read
    gpu_addmm = 2 * (2 * 64 * 512 + 2 * 64 * 128) * 4  # a GPU GEMM epilogue reads the bias (a model)
    addmm = 0  # the CPU's addmm pre-fills the output with the bias, BLAS beta = 1: the bytes of matmul + add
    assert f"ideal kernel: traffic saved by fuse_matmul_bias_act (bytes): {ideal}" in text
    assert f"model of MLX's own cpu lowering (no rlxviz kernels): saved (bytes): {addmm}" in text
    assert f"model of MLX's own cpu lowering (no rlxviz kernels): still written and read (bytes): {ideal}" in text
    assert f"model for a GPU (GEMM epilogue reads the bias): saved (bytes): {gpu_addmm}" in text
    # numerics, measured in the cell: the reference executor sees no change; MLX's lowering rounds
    ntext, _ = t["numerics"]
    num = re.findall(r"^#(\d) .+? f32 reference vs input (\S+); MLX cpu vs input (\S+)$", ntext, re.M)
    assert [n[0] for n in num] == ["0", "1", "2"] and all(float(n[1]) == 0.0 for n in num), ntext
    assert float(num[0][2]) == 0.0 and all(float(n[2]) < 1e-4 for n in num)
    assert float(re.search(r"fast erf vs exact on \[-6, 6\]: largest difference (\S+)", ntext).group(1)) < 1e-6
    f32, bf16 = (float(v) for v in re.findall(r"addmm vs matmul \+ add, \w+: largest difference (\S+)", ntext))
    assert 0 <= f32 < 1e-4 and bf16 > f32
    md_text = markdown_of(nb, "numerics-read-aloud")
    assert "no version changes a bit" in md_text
    assert f"differ from the unfused graph by {max(float(n[2]) for n in num):.1e} at most" in md_text
    doc = (ROOT / "docs" / "teach-and-debug.md").read_text(encoding="utf-8")  # pasted there from a real run
    pasted = re.search(r"cell `traffic-fmba`.*?```text\n(.*?)```", doc, re.S).group(1)
    assert pasted.strip() == text.strip(), "docs/teach-and-debug.md: re-paste notebook 01's traffic-fmba output"
    text, _ = t["step-rln"]
    assert "fuse_residual_ln.residual" in text and "FusedResidualLN(%15, %0, %11, %12)" in text
    assert str(2 * 2 * 64 * 128 * 4) not in text and "KiB" not in text  # the exercise's answers come later
    # what MLX runs, read from MLX, with rlxviz's CPU kernels (built in CI): fc1 + GELU become a matmul and one
    # bias+GELU kernel, fc2 one addmm, or (gemm="auto" on an AVX-512 build) each linear one RlxvizGemm; the norm
    # fusion becomes one residual+LayerNorm kernel
    text, _ = t["primitives"]
    prims = re.findall(r"^\s*(\d)\s+(input|after \S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)$",
                       text, re.M)
    assert [(p[0], p[2]) for p in prims] == [("0", "7"), ("1", "4"), ("2", "3")]
    k0, k1, k2 = (int(p[4]) for p in prims)
    assert "rlxviz CPU kernels: " in text and "not available" not in text
    assert k2 < k1 < k0 - 2
    assert "{'Add': 5, 'Matmul': 2" in text and "'RlxvizResidualLayerNorm': 1" in text
    md_text = markdown_of(nb, "primitives-read-aloud")
    gemm = default_gemm(rows=2 * 64)
    if gemm:
        assert "'RlxvizGemm': 2" in text and "'AddMM'" not in text and "'RlxvizBiasAct'" not in text
        assert "each linear (`Matmul` + `Add`, and GELU for the first) became one `RlxvizGemm`" in md_text
    else:
        assert "'AddMM': 1" in text and "'RlxvizBiasAct': 1" in text
        assert "became a `Matmul` and one `RlxvizBiasAct`, rlxviz's CPU kernel for bias + GELU" in md_text
    fallback = "mx.fast.layer_norm is one kernel here: False" in text
    # bytes per call read from MLX's graph: the table's columns, the lines below it and the prose agree
    moved = [(int(p[6].replace(",", "")), int(p[7].replace(",", ""))) for p in prims]
    for i, (graph_b, modelled) in enumerate(moved):
        assert f"#{i} bytes per call, read from MLX's graph: {graph_b} (+ {modelled} modelled) = " \
               f"{graph_b + modelled}" in text
    totals = [g + m for g, m in moved]
    assert totals[0] > totals[1] > totals[2] and moved[0][1] == 0
    # fc2's AddMM [2, 64, 128]: 1 write + 1 read more than the graph shows; rlxviz's GEMM has no pre-fill
    assert moved[1][1] == moved[2][1] == (0 if gemm else 2 * 2 * 64 * 128 * 4)
    assert f"MLX runs {k0} non-view primitives for the input, {k1} after" in md_text
    assert f"{totals[0]}, {totals[1]} and {totals[2]} B (of which {moved[1][1]} B" in md_text
    assert "the residual `Add` and the norm became one `RlxvizResidualLayerNorm` kernel" in md_text
    assert ("MLX runs its fallback" in md_text) == fallback
    # the roofline: FLOPs from the shapes, bytes of the executed program, a ridge measured now
    text, _ = t["roofline"]
    ridge, ops, versions, predicted = roofline_bounds(text)  # bounds: read against this run's ridge, not asserted
    assert [o[1] for o in ops] == ["matmul", "add", "gelu", "matmul", "add", "add", "layer_norm"]
    assert int(ops[0][2]) == 2 * 2 * 64 * 128 * 512 and int(ops[6][2]) == 8 * 2 * 64 * 128
    assert int(ops[2][2]) == 29 * 2 * 64 * 512  # GELU: erf's 25 FLOPs + 4 per element, not 1
    flops = sum(int(o[2]) for o in ops)
    assert [int(v[1]) for v in versions] == [flops] * 3  # fusion changes no FLOP
    b0 = sum(int(o[3]) for o in ops)
    assert [int(v[2]) for v in versions] == totals  # executed bytes: read from MLX's program (the table above)
    assert [int(v[3]) for v in versions] == [b0, b0 - ideal, b0 - ideal - 2 * 2 * 64 * 128 * 4]  # ideal: model
    md_text = markdown_of(nb, "roofline-read-aloud")
    assert f"a rough ridge of {ridge:.1f} FLOP/B" in md_text and f"{flops} FLOPs in every version" in md_text
    assert f"intensity {versions[0][4]} to {versions[2][4]} FLOP/B; ideal kernels: {versions[2][5]})" in md_text
    all_compute = set(predicted.values()) == {"compute"}
    assert ("every version is **compute-bound** on this machine" in md_text) == all_compute
    n_mem = sum(o[5] == "memory" for o in ops)
    assert (f"{n_mem} of the 7 ops are memory-bound" in md_text) if n_mem else ("no op falls below it" in md_text)
    text, _ = t["timing"]
    assert "all versions match the reference: True" in text and "timed on: MLX" in text and " on cpu" in text
    assert re.search(r"^memory check \(time\): estimated peak .+ of the .+ limit", text, re.M)  # as `rlxviz time`
    assert len([ln for ln in text.splitlines() if ln.rstrip().endswith("yes")]) == 3
    errs = [float(v) for v in re.findall(r"error vs input on MLX: (\S+)", text)]
    assert len(errs) == 3 and errs[0] == 0.0 and max(errs) < 1e-5  # same backend: what the rewrite changed
    medians = {ln.split()[1] + ln.split()[2]: _cells(ln)[-8] for ln in text.splitlines()
               if re.match(r"\s*\d+\s+(input|after)", ln)}
    medians["input"] = medians["input7"]  # by version label
    # the sentences read aloud quote the table's own medians and one verdict per fused version
    text, _ = t["read-aloud"]
    verdicts = re.findall(r"^verdict (after \S+): " + VERDICT + "$", text, re.M)
    assert [v[0] for v in verdicts] == ["after fuse_matmul_bias_act", "after fuse_residual_ln"], text
    md_text = markdown_of(nb, "read-aloud")
    assert "21 paired rounds" in md_text
    prev = "input"
    for label, verdict in verdicts:  # each version against the previous one, the table's own medians
        said = re.search(rf"\*\*{label}\*\* vs #\d: median {medians[label.replace(' ', '')]} vs "
                         rf"{medians[prev.replace(' ', '')]} ms; per-round ratio (\S+) \(95% CI (\S+)\.\.(\S+)\): "
                         rf"\*\*{re.escape(verdict)}\*\*", md_text)  # DISAGREE's words hold parentheses
        assert said, (label, md_text)
        ratio, low, high = (float(x) for x in said.groups())
        assert low <= ratio <= high
        assert_verdict(verdict, ratio, low, high)
        prev = label
    held = all_compute and all(v == "within noise" for _, v in verdicts)
    timed_rows = [_cells(ln) for ln in t["timing"][0].splitlines() if re.match(r"\s*\d+\s+(input|after)", ln)]
    busy = any(float(r[-8]) > BUSY_RATIO * float(r[-7]) or float(r[-6]) > NOISY_IQR * float(r[-8])
               for r in timed_rows)  # median > 2 x min or IQR > 0.5 x median: the run is not read
    assert ("the verdicts below are printed, not to be read" in md_text) == busy
    assert md_text.count("unusable run") == int(busy)  # said once, not on every line
    assert ("the paired rounds agree, no version differs" in md_text) == (held and not busy)
    differs = not busy and any(v != "within noise" for _, v in verdicts)
    assert ("the paired rounds find a difference" in md_text) == differs
    assert ("yet the paired rounds find a difference" in md_text) == (differs and all_compute)
    assert ("the bytes removed bought nothing measurable" in md_text) == (not busy and not differs and not all_compute)
    assert ("this run cannot confirm or refute it" in md_text) == busy
    text, _ = t["roofline-measured"]
    measured = re.findall(r"^measured (.+?)\s+(\S+) FLOP/B  (\S+) GFLOP/s", text, re.M)
    assert [m[1] for m in measured] == [v[4] for v in versions]  # the roofline's own intensities
    for (label, _, achieved), v in zip(measured, versions, strict=True):  # FLOPs over the table's median
        median = float(medians[label.replace(" ", "")])  # printed to 0.01 ms: 1.4% at 0.37 ms
        low, high = (int(v[1]) / (median + d) / 1e6 for d in (0.005, -0.005))
        assert low - 0.006 <= float(achieved) <= high + 0.006, (label, achieved, low, high)
    svg = [o.data["text/html"] for c in nb.cells if "roofline-measured" in c.metadata.get("tags", [])
           for o in c.outputs if "text/html" in o.get("data", {})]
    assert svg and svg[0].count("<circle") == 3 and "<polyline" in svg[0]
    md_text = markdown_of(nb, "roofline-conclusion")
    n_compute = list(predicted.values()).count("compute")  # the same intensities against the same ridge
    shown = re.search(r"^compute-bound versions: (.*)$", text, re.M).group(1)
    assert shown == (", ".join(m[0] for m, v in zip(measured, versions, strict=True) if predicted[v[0]] == "compute")
                     or "none")
    assert f"{n_compute} of 3 versions sit right of the ridge ({ridge:.1f} FLOP/B)" in md_text
    assert ("**all are compute-bound**, so removing bytes cannot help" in md_text) == (n_compute == 3)
    best = min(float(x) for x in re.findall(r"^prediction #\d: \w+-bound, at best (\S+) ms$", t["roofline"][0], re.M))
    assert f"A roofline is a ceiling, not a time: its best is {best:.3f} ms" in md_text
    meds = [float(r[-8]) for r in timed_rows]
    assert f"the versions took {min(meds):.2f}-{max(meds):.2f} ms (median; fastest round " in md_text
    assert ("busy machine" in md_text) == busy
    peak = float(re.search(r"matmul (\S+) GFLOP/s", t["roofline"][0]).group(1))
    top = max(float(m[2]) for m in measured)  # 2 decimals against the peak's 1: either within their rounding
    if abs(top - peak) > RIDGE_HALF + 0.005:
        assert ("That is above the measured peak" in md_text) == (top > peak)
    differ = not busy and any(v != "within noise" for _, v in verdicts)  # the paired verdicts read aloud above
    assert ("yet the paired rounds find them different" in md_text) == differ
    if not busy and not differ:
        assert ("More than 3 times" in md_text) != ("within 3 times" in md_text)
    text, _ = t["recorded-gpu"]
    logs = sorted((ROOT / "benchmarks" / "logs").glob("*.txt"))  # which devices the project's own logs are from
    on_gpu = [p.name for p in logs if "Device(gpu" in p.read_text(encoding="utf-8")]
    assert text.startswith(f"benchmarks/logs/: {len(logs)} logs, measured on ")
    assert ("GPU logs: none (" in text) == (not on_gpu)
    assert "\nRECORDED (issue 12, H200, mlx-cuda 0.32.4) - not measured" in text
    assert "RECORDED (issue 23) - not measured in this notebook" in text and " 0.029\n" in text
    assert "2.50 ms  (1.42x input)" in text and "3.54 ms  (1.00x input)" in text
    assert "3.12 ms  (1.13x input)" in text
    md_text = markdown_of(nb, "recorded-gpu-read-aloud")  # the prose quotes the final version too
    assert "(3.44-3.52 ms vs 3.54 ms)" in md_text and "2.50 ms, a speed-up of 1.42x over the input" in md_text
    assert "torch.compile's 1.42 ms in the table is a time" in md_text
    assert "1.04 ms saved" in md_text and "**overhead-bound**" in md_text
    assert "3.12 ms (after `mark_elementwise_regions`) is **one unpaired run**" in md_text
    assert "do not show that the elementwise regions hurt" in md_text
    assert "about 0.029 ms (issue 23's count" in md_text and "gave 2.49 vs 2.52 ms" in md_text
    assert ("`benchmarks/logs/` holds no GPU run" in md_text) == (not on_gpu)
    assert "give a tuple of 2 numbers, (ideal, executed); you gave a single int" in probe(t, "probe-single-number")
    assert "ideal: '131072' is text (in quotes)" in probe(t, "probe-strings")
    assert "yours has 3" in probe(t, "probe-three")
    assert "you counted the write of the sum only" in probe(t, "probe-write-only")
    assert "compare the primitives of versions 1 and 2 above" in probe(t, "probe-executed-ideal")
    assert "not the other way" in probe(t, "probe-executed-reversed")
    exercise_feedback(nb, t)
    # drawings are inline SVG in a scrolling box
    svgs = [o.data["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "data" in o and "text/html" in o.data]
    assert len(svgs) >= 3 and all("<svg" in s and "overflow:auto" in s for s in svgs)


def test_02_fusing_a_bert_layer(executed):
    nb = executed("02_fusing_a_bert_layer.ipynb")
    t = common(nb)
    text, _ = t["load"]
    assert "all-MiniLM-L6-v2" in text and "tokens: " in text
    text, _ = t["pipeline"]
    assert "fused layers: 6" in text
    from rlxviz.passes import CANONICAL_ORDER, Pipeline
    from rlxviz.passes.pipeline import STAGES

    n_dce = list(CANONICAL_ORDER).count("dead_code_elimination")
    steps = [p.name for p in Pipeline.canonical().steps()]  # fuse_sdpa's stages are steps of their own (issue 36)
    assert (f"canonical pipeline: {len(steps)} steps, {len(set(steps))} distinct passes "
            f"(dead_code_elimination runs {n_dce} times)") in text
    # per layer 3 matmuls + 3 bias adds -> 1 matmul, 1 add, 2 concats (weights, biases), 3 narrows: 6 layers
    assert "fuse_shared_input_matmul: nodes 118 -> 124 (matmul -12, add -12, concat +12, narrow +18)" in text
    assert len(re.findall(r"^\s*\d+\s+fuse_|^\s*\d+\s+dead_code|^\s*\d+\s+mark_", text, re.M)) == 11 + len(STAGES)
    text, html = t["version-input"]
    assert text.startswith("version 0: input") and html and "<svg" in html[0] and "overflow:auto" in html[0]
    text, _ = t["ftl-matches"]
    assert "FusedTransformerLayer matches: 6" in text
    assert all(f"layer {i}: -> %" in text for i in range(6))
    assert text.count("attn=%") == 6 and text.count("FusedAttentionBlock") == 6
    text, _ = t["runs-as"]  # from the lowering: the macro op is compiled on the GPU only
    assert re.search(r"FusedTransformerLayer\s+x6\s+cpu: its decomposition, op by op\s+gpu: one mx.compile'd", text)
    text, _ = t["traffic"]
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[1:] if re.match(r"fuse_\w+\s+\d", ln)}
    x = 1 * 16 * 384 * 4  # the hidden state Q, K and V read: 2 reads and 4 launches (2 matmul, 2 add) per layer
    assert rows["fuse_shared_input_matmul"][:3] == ["0", "0", "0"]  # no intermediate credited
    assert f"{6 * 2 * x} B, 24 launches" in text
    assert rows["fuse_residual_ln"][1:3] == ["0", "0"]  # add + mx.fast.layer_norm on both devices
    assert rows["fuse_sdpa"][1:3] == ["0", "0"]  # composed on the CPU; MLX's SDPA falls back at head_dim 32
    assert rows["fuse_matmul_bias_act"][1] == "0"  # the CPU's addmm pre-fills the bias (beta = 1)
    assert 0 < int(rows["fuse_matmul_bias_act"][2]) < int(rows["fuse_matmul_bias_act"][0])  # GPU epilogue model
    ftl = rows["fuse_transformer_layer"]
    assert (f"fuse_transformer_layer, model of MLX's own cpu lowering (no rlxviz kernels): executed saving {ftl[1]} "
            f"B of {ftl[0]} B ideal") in text
    # MLX's own primitives: the launch count the traffic model credits is the program's own
    text, _ = t["primitives"]
    prims = re.findall(r"^\s*(\d+)\s+(input|after \S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)$",
                       text, re.M)
    assert len(prims) == len(steps) + 1 and prims[0][2] == "196"
    totals = [int(p[6].replace(",", "")) + int(p[7].replace(",", "")) for p in prims]  # bytes read from MLX
    saved = [int(v) for v in re.findall(r"bytes per call saved, read from MLX: (-?\d+)$", text, re.M)]
    assert saved == [a - b for a, b in zip(totals, totals[1:], strict=False)] and totals[-1] < totals[0]
    kernels = {p[1] if p[1] == "input" else f"{p[0]} {p[1]}": int(p[4]) for p in prims}
    by_index = [int(p[4]) for p in prims]
    k = [p[1] for p in prims].index("after fuse_shared_input_matmul")
    assert by_index[k - 1] - by_index[k] == 24  # the 24 launches of the traffic table
    f = [p[1] for p in prims].index("after fuse_transformer_layer")
    assert by_index[f] == by_index[f - 1] and by_index[-1] < by_index[0] and len(kernels) == len(prims)
    md_text = markdown_of(nb, "primitives-read-aloud")
    assert f"MLX's program from {by_index[0]} to {by_index[-1]} non-view primitives" in md_text
    assert "`fuse_transformer_layer` takes the graph from 52 to 28 ops and changes nothing MLX runs" in md_text
    assert f"Bytes per call, read from the same programs: {totals[0]} for the input, {totals[-1]} for" in md_text
    assert f"({prims[-1][6].replace(',', '')} from MLX's graph + {prims[-1][7].replace(',', '')} modelled" in md_text
    assert "rlxviz CPU kernels in the programs: RlxvizAttention" in text  # built in CI
    text, _ = t["gpu-timing"]  # offered where MLX has a GPU; says so where it has none
    has_gpu = "gpu = GPU (" in text
    assert text.startswith("MLX devices here: ") and "cpu = CPU (" in text
    assert ("no GPU for MLX on this machine" in text) == (not has_gpu)
    assert ("gpu verdict after " in text) == has_gpu
    text, _ = t["numerics"]  # measured in the cell: the reference changes at fuse_sdpa's reassociation only
    ref = re.findall(r"^\s*(\d+)\s+(input|after \S+)\s+(\S+)\s+(\S+)$", text, re.M)
    assert len(ref) == len(steps) + 1 and float(ref[0][2]) == float(ref[0][3]) == 0.0
    k_sdpa = [r[1] for r in ref].index("after fuse_sdpa")
    assert all(float(r[2]) == 0.0 for r in ref[:k_sdpa]) and 0 < float(ref[k_sdpa][2]) < 1e-4
    assert "first version whose f32 reference output changes: after fuse_sdpa | versions that change it: 1" in text
    assert float(re.search(r"fast erf vs exact on \[-6, 6\]: largest difference (\S+)", text).group(1)) < 1e-6
    f32, bf16 = (float(v) for v in re.findall(r"addmm vs matmul \+ add, \w+: largest difference (\S+)", text))
    assert 0 <= f32 < 1e-4 and bf16 > f32  # bf16 rounds the bias add far more coarsely
    md_text = markdown_of(nb, "numerics-read-aloud")
    assert "that is `fuse_sdpa`'s reassociation of the scale, and no other pass changes a bit there" in md_text
    text, _ = t["timing"]
    assert "all match the reference: True" in text and " on cpu" in text
    assert re.search(r"^memory check \(time\): estimated peak .+ of the .+ limit", text, re.M)  # as `rlxviz time`
    assert "after fuse_transformer_layer" in text and "(unchanged: same as #" in text
    # the same-dtype tolerance, per element; MiniLM's outputs stay within |10| (6.3 at most over the battery), so
    # no element may differ by more than atol + 10 rtol. The summation order of the kernels differs by vector
    # width: 1.13e-4 on AVX2 at a 2.0 output (2026-12-03), under 1e-4 on AVX-512. A broken pass gives 1e-1 and up.
    err, rtol, atol = (float(v) for v in re.search(
        r"largest error vs input on MLX: (\S+) \(after \w+; each element is judged by \|fused - input\| <= "
        r"atol \+ rtol \* \|input\|, rtol (\S+), atol (\S+)\)", text).groups())
    assert 0 < err <= atol + 10 * rtol and (rtol, atol) == (1e-4, 1e-4)
    table = {ln.split()[1] + " " + ln.split()[2]: _cells(ln) for ln in text.splitlines()
             if re.match(r"\s*\d+\s+(input|after)", ln) and "unchanged" not in ln}
    text, _ = t["read-aloud"]
    verdicts = re.findall(r"^verdict (after \S+): " + VERDICT + r" \(vs #(\d+); "
                          r"ratio (\S+), 95% CI (\S+)\.\.(\S+)\)$", text, re.M)
    assert len(verdicts) == len(table) - 1, (verdicts, table)
    timed_idx = [int(v[0]) for v in table.values()]
    assert [int(v[2]) for v in verdicts] == timed_idx[:-1]  # each against the previous timed version
    for _, words, _, ratio, low, high in verdicts:
        assert float(low) <= float(ratio) <= float(high)
        assert_verdict(words, float(ratio), float(low), float(high))
    md_text = markdown_of(nb, "read-aloud")
    last = list(table)[-1]
    assert "21 paired rounds" in md_text
    assert f"median {table[last][-8]} vs {table[list(table)[0]][-8]} ms, **" in md_text
    n_noise = sum(v[1] == "within noise" for v in verdicts)
    assert f"{n_noise} of {len(verdicts)} steps are within noise" in md_text
    mins = [(float(v[-8]), float(v[-7]), float(v[-6])) for v in table.values()]  # median, min, IQR
    assert ("a busy machine" in md_text) == any(m > BUSY_RATIO * lo or iqr > NOISY_IQR * m for m, lo, iqr in mins)
    assert f"credits its executed saving on the CPU with {ftl[1]} B" in md_text
    # one fused op's kernels, read from MLX: rlxviz's bias + GELU kernel vs MLX's own lowering; the GPU said plainly
    text, _ = t["op-kernels"]
    ops = dict(re.findall(r"^(cpu, [^:]+|gpu \(read from MLX here\)): \d+ kernels: (.+)$", text, re.M))
    ours = ["RlxvizGemm"] if default_gemm(rows=16) else ["Matmul", "RlxvizBiasAct"]  # x [1, SEQ = 16, 384]
    assert ops["cpu, rlxviz's kernels (default)"].split(" -> ") == ours, ops
    mlx_own = ops["cpu, MLX's own lowering"].split(" -> ")
    assert "AddMM" in mlx_own and not any(k.startswith("Rlxviz") for k in mlx_own), ops
    assert all(len(k) < 60 for k in mlx_own) and any(k.startswith("Compiled(") for k in mlx_own), mlx_own  # readable
    assert ("gpu: no GPU for MLX on this machine" in text) == (not has_gpu) == ("gpu (read from MLX here)" not in ops)
    md_text = markdown_of(nb, "op-kernels-read-aloud")
    assert f"is **{len(ours)}** kernel(s) on this CPU with rlxviz's kernels" in md_text
    assert ("rlxviz's GEMM, the bias and GELU applied in its store" in md_text) == (ours == ["RlxvizGemm"])
    assert f"**{len(mlx_own)}** with MLX's own lowering" in md_text
    # fusion that does not pay, live: four lowerings of the final version in paired rounds, verdicts as printed
    text, _ = t["compile-layer"]
    low = re.findall(r"^(MLX's lowering, [^\d]+?|rlxviz's CPU kernels \(the default\))\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+"
                     r"(\d+)\s+(\d+)\s+(\S+)\s+(\d+\.\d\d)$", text, re.M)  # ..., max diff, IQR ms
    assert len(low) == 4, text
    assert int(low[1][4]) > int(low[0][4]) and int(low[2][4]) >= 1  # each layer / the graph: compiled kernels
    assert all(float(x[5]) < 1e-4 for x in low)  # the same function under every lowering
    lv = re.findall(r"^lowering verdict (.+?): " + VERDICT + r" \(vs .+?; ratio (\S+), "
                    r"95% CI (\S+)\.\.(\S+)\)$", text, re.M)
    assert len(lv) == 3
    for _, words, ratio, lo, hi in lv:
        assert_verdict(words, float(ratio), float(lo), float(hi))
    assert "RECORDED, not measured here: whole FusedTransformerLayer compiled vs op by op: 272 vs 230 ms" in text
    md_text = markdown_of(nb, "compile-layer-read-aloud")
    assert "21 paired rounds" in md_text and "at batch 4, seq 32" in md_text
    assert f"compiling each layer is **{lv[0][1]}**" in md_text
    busy_low = any(float(x[1]) > BUSY_RATIO * float(x[2]) or float(x[6]) > NOISY_IQR * float(x[1]) for x in low)
    assert ("a busy machine" in md_text) == busy_low
    assert ("draw no conclusion from them" in md_text) == busy_low  # an unusable run concludes nothing
    assert not busy_low or "does not pay on this CPU" not in md_text and "measured faster" not in md_text
    assert "at 16 tokens" not in md_text  # the live run is at batch 4, seq 32: 128 tokens
    text, _ = t["order-silent"]
    assert "fuse_transformer_layer first: 0 matches, 0 rejections; fused layers at the end: 0" in text
    text, _ = t["order"]
    assert "0 matches, 6 rejections" in text and text.count(": attn_is_fused_block: ") == 6
    assert "run fuse_attention_block first" in text and "fused layers: 0" in text
    # profitability: RLX's 64-token gate is a guard of kind "not profitable"; what it would save, measured
    from rlxviz.passes.rules.attention import BLOCK

    assert BLOCK.guard_kinds["attention_size_gate"] == "not profitable"
    text, _ = t["gate"]
    assert "small: batch*seq = 16: fuse_attention_block with the gate at 64: 6 fused, 0 rejected" in text
    assert "large: batch*seq = 256: fuse_attention_block with the gate at 64: 0 fused, 6 rejected" in text
    assert "attention_size_gate (not profitable): attn (node " in text
    assert "has batch*seq = 2*128 = 256; the gate (pipeline param fab_max_tokens) allows at most 64" in text
    ideal = [int(v) for v in re.findall(r"ideal kernel saves (\d+) B", text)]
    assert len(ideal) == 2 and ideal[0] > 0 and ideal[1] == 16 * ideal[0]  # 16x the tokens, 16x the bytes
    # FusedAttentionBlock runs as its decomposition
    assert text.count("model of MLX's own lowering saves cpu 0 B, gpu 0 B") == 2
    assert "FusedAttentionBlock runs as: cpu: its decomposition, op by op, gpu: its decomposition, op by op" in text
    text, _ = t["gate-timing"]
    timed = re.findall(r"^(small|large): batch\*seq = (\d+): unfused (\S+) ms .*?, fused (\S+) ms .*?: "
                       + VERDICT + r"; bytes per call saved, read from MLX: (-?\d+) B; "
                       r"error vs unfused (\S+)$",
                       text, re.M)
    assert [(x[0], x[1]) for x in timed] == [("small", "16"), ("large", "256")], text
    assert all(float(x[6]) < 1e-5 for x in timed)
    md_text = markdown_of(nb, "gate-read-aloud")
    assert f"move {timed[0][5]} B and {timed[1][5]} B less per call after the fusion (read from MLX)" in md_text
    assert f"at 16 tokens the fused attention block is **{timed[0][4]}**, at 256 tokens **{timed[1][4]}**" in md_text
    losing = timed[1][4].endswith("slower")
    assert ("Nothing here shows the fused block losing above 64 tokens" in md_text) == (not losing)
    exercise_feedback(nb, t)
    assert "bytes: 49152.5 is not a whole number" in probe(t, "probe-float")
    assert "and so do their three bias adds: count both kinds of launch" in probe(t, "probe-matmuls-only")
    assert "three reads became one: count the reads saved" in probe(t, "probe-reads-before")


def test_03_why_did_my_layer_not_fuse(executed):
    nb = executed("03_why_did_my_layer_not_fuse.ipynb")
    t = common(nb)
    text, _ = t["all-cases"]
    expected = {"output_intermediate": "h1_not_output", "extra_h1_user": "h1_user_count",
                "dead_h1_user": "h1_user_count", "tanh_gelu": "fc1_activation", "pre_ln": "post_ln_order",
                "swapped_residual": "-", "over_threshold": "attention_size_gate"}
    legal = {"output_intermediate", "extra_h1_user"}  # a reader the model returns: fused as far as legal
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()}
    assert set(rows) == set(expected)
    kinds = catalog_kinds()
    for case, guard in expected.items():
        # add is commutative: the residual in either order fuses; tanh-GELU is a gap in rlxviz's ops (fused as far as
        # rlxviz's ops go: nothing in the model keeps its numbers and fuses)
        status = ("fused" if case == "swapped_residual" else "fused as far as legal" if case in legal
                  else "fused as far as rlxviz's ops go" if case == "tanh_gelu" else "not fused")
        assert f"layer 0: {status} " in rows[case] and f"guard={guard} " in rows[case], rows[case]
        assert f"kind={kinds.get(guard, '-')} " in rows[case], rows[case]  # the kind the rule catalog declares
        sibling = "not fused" if case == "over_threshold" else "fused"  # the gate applies to every layer
        assert rows[case].rstrip().endswith(f"layer 1: {sibling}")
    text, _ = t["kinds"]  # the product's own kind, fix and compiler fix per case
    for case, guard in expected.items():
        if case != "swapped_residual":
            assert f"{case}: {guard} [{kinds[guard]}]" in text
    assert "tanh_gelu: fc1_activation [not recognized], a gap in rlxviz's ops: FusedTransformerLayer with a " \
        "gelu_tanh epilogue" in text
    assert "swapped_residual: fused (fuse_transformer_layer.bert_post_ln; the residual add is accepted" in text
    assert "compiler fix: add gelu_tanh to the epilogue allow-list" in text
    assert "compiler fix: a pre-LN layer op (no rule builds one" in text  # pre_ln: the variant's own change first
    assert "fix:          exact GELU (gelu) fuses, but switching the model to it changes" in text  # not "or silu"
    assert text.count("compiler fix: multi-output fusion: a layer op that also returns ln1 (role h1) as a second "
                      "output") == 2  # extra_h1_user's, output_intermediate's; dead_h1_user's is DCE first
    # extra_h1_user's extra reader is a returned probe: no dead-code elimination is advised (issue 39: it was, and
    # DCE cannot remove a graph output); the fix says the model returns it. dead_h1_user's probe is dead: DCE is
    extra = text.split("extra_h1_user: ", 1)[1].split("\n", 3)
    assert "(illegal here: layer 0 is fused as far as legal)" in extra[0]
    assert "dead_code_elimination" not in extra[1]
    assert "graph output #1, reads ln1 (role h1)" in extra[1] and "keep ln1 (role h1) materialised" in extra[1]
    dead = text.split("dead_h1_user: ", 1)[1].split("\n", 3)
    assert "illegal here" not in dead[0] and "dead_code_elimination run on the model removes it" in dead[1]
    assert "compiler fix: dead_code_elimination before fuse_transformer_layer: " in "".join(dead[1:3]), dead
    text, _ = t["tanh-cost"]  # "use exact GELU" changes the model: by how much, computed
    gap = float(re.search(r"largest difference (\S+) at x = ", text).group(1))
    assert 4e-4 < gap < 5e-4
    assert float(re.search(r"exact GELU in layer 0: largest difference (\S+)", text).group(1)) > 0
    text, html = t["one-case"]
    assert "rlxviz's ops lack: FusedTransformerLayer with a gelu_tanh epilogue (fuse_transformer_layer.bert_post_ln: " \
        "fc1_activation)" in text and "layer 0: fused as far as rlxviz's ops go" in text
    outputs = [o for c in nb.cells if "one-case" in c.metadata.get("tags", []) for o in c.outputs]
    drawn = [o.data["text/html"] for o in outputs if "data" in o and "text/html" in o.data]
    assert drawn and "<svg" in drawn[0] and "overflow:auto" in drawn[0]
    text, _ = t["fix-model"]
    assert "dead_code_elimination first, probe still returned: h1_user_count" in text  # DCE alone does not fix it
    assert "canonical order: h1_user_count" in text and "fused layers = 2" in text
    text, _ = t["fix-pipeline"]
    assert "fused layers = 2" in text
    text, _ = t["pre-ln-second"]  # pre-LN's second blocker: the residual sum the single-output norm would hide
    from rlxviz.passes.rules.layer import LAYER

    assert f"post_ln_order kind: {LAYER.guard_kinds['post_ln_order']}" in text
    assert "pre_ln layer 0, fuse_residual_ln: sum_single_user (illegal): " in text  # measured, not said
    text, _ = t["eps-outside"]  # the truly illegal case: refused whatever the kernel
    assert "eps inside the sqrt: 1 match(es); rejection: -" in text
    assert "eps outside the sqrt: 0 match(es); rejection: eps_inside_sqrt (illegal): " in text
    assert float(re.search(r"x of std 1e-3: largest difference (\S+)", text).group(1)) > 0.1
    exercise_feedback(nb, t)
    text, _ = t["exercise"]
    assert "fix_ir returned the text unchanged" in text  # the stub is told what is wrong
    text, _ = t["solution"]
    assert "layer 0 fuses" in text
    assert "fix_ir returned None: end it with `return`" in probe(t, "probe-no-return")
    assert "parse_ir cannot read your text: " in probe(t, "probe-typo")
    assert "pass the function itself" in probe(t, "probe-not-callable")
    assert "keep the model's output (the first one), drop the probe of h1" in probe(t, "probe-keeps-probe")


def catalog_kinds():
    """Guard name -> kind from the product's rule catalog (every rule of every pass)."""
    from rlxviz.passes import PASSES

    return {g: k for p in PASSES.values() for r in p.rules for g, k in r.guard_kinds.items()}


def test_04_write_your_own_pattern_and_guard(executed):
    from rlxviz.passes.rules.layer import LAYER
    from rlxviz.passes.rules.linear import BIAS_ACT

    nb = executed("04_write_your_own_pattern_and_guard.ipynb")
    t = common(nb)
    text, _ = t["anatomy"]  # the rule read as a table: the kinds are the product's own
    assert text.startswith("fuse_matmul_bias_act.bias_act defined at rlxviz/passes/rules/linear.py:")
    for name, kind in BIAS_ACT.guard_kinds.items():
        assert re.search(rf"step {name}\s+kind: {kind}$", text, re.M), name
    text, _ = t["strict"]
    assert "strict pipeline on swapped_residual: fused layers = 1" in text
    assert f"layer 0: guard ln1_operand_order ({LAYER.guard_kinds['ln1_operand_order']}): " in text
    assert "compiler fix: canonicalize commutative adds (branch first) before matching" in text
    exercise_feedback(nb, t)
    text, _ = t["solution"]
    assert "2 adds rewritten, verifier passed, outputs equal bit for bit, idempotent; the strict pipeline fuses 2 " \
           "layers" in text
    text, _ = t["compare-canon"]
    rows = {r[0]: r[1:] for r in re.findall(r"^(.+?)\s+fused layers = (\d); layer 0 ln1: x=(\w+), residual=(\w+); "
                                           r"max \|diff\| vs unfused = (\S+)$", text, re.M)}
    assert rows["strict rule"][0] == "1"
    assert rows["canonicalize_add + strict rule"][:3] == ("2", "FusedAttentionBlock", "layer_norm")
    assert rows["product (commutative guards)"][:3] == ("2", "layer_norm", "FusedAttentionBlock")
    assert all(float(r[3]) == 0.0 for r in rows.values())  # add commutes bit for bit
    text, _ = t["tanh-before"]
    assert text.startswith(f"epilogue_activation ({BIAS_ACT.guard_kinds['epilogue_activation']}): ")
    assert "compiler fix: add gelu_tanh to the epilogue allow-list" in text
    exercise_feedback(nb, t, "exercise-b", "solution-b")
    text, _ = t["solution-b"]
    assert "FusedMatMulBiasAct(activation='gelu_tanh'), max |diff| 0.0e+00, verifier passed" in text
    assert "probe refused by fc_single_user (illegal); gate: epilogue_size_gate (not profitable)" in text
    text = probe(t, "probe-absorb-act-only")  # the old pre-activation node would stay: not accepted
    assert "the old pre-activation node is still there (FusedMatMulBiasAct 8 -> 9, compute nodes 32 -> 32" in text
    assert "absorb both fc and act" in text
    assert "with epilogue_max_rows=4 the 8-row FFN still fused: add a size_le gate" in probe(t, "probe-no-size-gate")
    assert "only the 2 residual adds of layer 0 are out of order" in probe(t, "probe-swap-every-add")
    assert "the operand computed later (the larger id) must come first" in probe(t, "probe-swap-keeps-order")
    text, _ = t["after-epilogue"]
    assert "epilogue matches: 1; fused layers = 1" in text
    assert ("layer 0: fused as far as rlxviz's ops go; rlxviz's ops lack FusedTransformerLayer with a gelu_tanh "
            "epilogue (fuse_transformer_layer.bert_post_ln: fc1_activation)") in text  # a gap, not a near-miss
    assert "FusedMatMulBiasAct(activation=gelu_tanh)" in text and "compiler fix: add gelu_tanh" in text


def test_04_solutions_are_checked_passes():
    """The solutions are product-API passes: A is idempotent and exact, B refuses an extra reader (illegal)."""
    sys.path.insert(0, str(NB_DIR))
    try:
        import solutions
    finally:
        sys.path.remove(str(NB_DIR))
    from rlxviz.ir import Builder
    from rlxviz.passes import run_passes

    b = Builder("swap")
    x = b.input("x", (2, 3))
    y = b.add(x, b.gelu(x))  # skip first: add(x, branch)
    b.output(b.add(y, b.param("bias", (3,))))  # a bias add: operands differ in shape, left alone
    step = run_passes(b.build(), [solutions.ex04a()]).steps[0]
    assert len(step.matches) == 1 and not step.error
    add = step.after[step.matches[0].fused]
    assert add.inputs[0] > add.inputs[1]  # the later operand (gelu) first
    assert not run_passes(step.after, [solutions.ex04a()]).steps[0].matches  # idempotent
    b = Builder("probe")
    x = b.input("x", (4, 8))
    pre = b.linear(x, b.param("w", (8, 8)), b.param("b", (8,)))
    b.output(b.gelu_tanh(pre), pre)  # the pre-activation is a graph output
    last = run_passes(b.build(), ["fuse_matmul_bias_act", solutions.ex04b()]).steps[-1]
    assert not last.matches and {(r.guard, r.kind) for r in last.rejections} >= {("fc_not_output", "illegal")}


def test_05_bring_your_own_model(executed):
    import onnx

    nb = executed("05_bring_your_own_model.ipynb")
    t = common(nb)
    path = ROOT / "tests" / "fixtures" / "onnx" / "gpt2.onnx"
    src = onnx.load(str(path))
    text, _ = t["onnx-file"]  # the file's own figures, read again here
    assert f"gpt2.onnx: {path.stat().st_size} bytes, producer pytorch " in text
    assert f"ONNX nodes: {len(src.graph.node)}" in text and "input input_ids: INT64 ['batch', 'seq']" in text
    assert "config: gpt2, 2 layers, hidden size 64, 4 heads, activation gelu_new" in text  # gpt2.json
    text, _ = t["import"]
    assert re.search(r"^version 0 equals the ONNX model \(ONNX Runtime \S+\): max err \S+ on last_hidden_state$",
                     text, re.M), text
    assert re.search(r"^memory check \(load\): estimated peak .+ of the .+ limit \(default\)$", text, re.M)
    assert re.search(r"^memory check \(run\): estimated peak ", text, re.M)
    n_ir = int(re.search(rf"ONNX nodes {len(src.graph.node)} -> rlxviz compute nodes (\d+)", text).group(1))
    assert 0 < n_ir < len(src.graph.node)  # shape arithmetic folded
    text, _ = t["layers"]
    assert text.count("pre-LN (GPT-2, ViT)") == 2 and "layer norms in the model: 5 (h.0.ln_1, h.0.ln_2, h.1.ln_1, " \
                                                       "h.1.ln_2, ln_f)" in text
    text, _ = t["pipeline"]
    final = eval(re.search(r"^final ops: (\{.*\})$", text, re.M).group(1))  # the cell's own dict
    assert "layers: {\"fused as far as rlxviz's ops go\": 2} of 2" in text  # as the CLI's headline counts them
    assert ("rlxviz's ops lack: FusedMatMulBiasAct with a gelu_tanh epilogue (fuse_matmul_bias_act.bias_act: "
            "epilogue_activation)") in text
    md_text = markdown_of(nb, "why-read-aloud")  # the prose quotes the pipeline cell's counts
    assert (f"So the {final['FusedMatMulBiasAct']} linears left outside the attention blocks fuse with their bias "
            f"alone, as `FusedMatMulBiasAct` (the attention's projections are inside its "
            f"{final['FusedAttentionBlock']} `FusedAttentionBlock`s, their bias too), and {final['gelu_tanh']} "
            "`gelu_tanh`") in md_text  # not "4 linears fuse": the attention's projections fuse with their bias too
    from rlxviz.passes import EPILOGUE_ACTIVATIONS  # the allow-list as the code has it, not as someone typed it

    assert f"`FusedMatMulBiasAct` takes only {', '.join(f'`{a}`' for a in EPILOGUE_ACTIVATIONS)}. So" in md_text
    assert f"fused **{final['FusedResidualLN']} of the 5** norms (the final ln_f) and refused 4, each by " \
           "`sum_single_user`" in md_text
    text, _ = t["ort"]
    made = dict((op, int(k)) for k, op in re.findall(r"^  made (\d+) x (\S+) ", text, re.M))
    assert made.get("com.microsoft.SkipLayerNormalization") == 1 and made.get("com.microsoft.FastGelu") == 2
    assert float(re.search(r"optimized vs source model: max err (\S+)", text).group(1)) < 1e-5
    assert "LayerNormalization nodes left: 4 of 5" in text
    unavailable = "transformer optimizer: not available here (" in text
    assert unavailable or "transformer optimizer: available here" in text
    text, _ = t["ort-vs-rlxviz"]
    assert re.search(r"residual add \+ LayerNorm\s+1 SkipLayerNormalization of 5 norms\s+"
                     rf"{final['FusedResidualLN']} FusedResidualLN of 5 norms", text), text
    # the attention row counts the attention where the pipeline left it: packed, or inside the fused op that took
    # it in (it said "0 attention" beside the pipeline cell's 'FusedAttentionBlock': 2)
    held = [op for op in ("attention", "FusedAttentionBlock", "FusedTransformerLayer") if op in final]
    assert held and sum(final[op] for op in held) == 2, final  # GPT-2's two layers, each attention packed
    row = re.search(r"^attention\s+\d+ FusedMatMul \(Q @ K\^T with its scale\)\s+(.+)$", text, re.M).group(1)
    assert row.startswith(" + ".join(f"{final[op]} {op}" for op in held) + " (fuse_sdpa"), row
    md_text = markdown_of(nb, "ort-read-aloud")
    assert f"rlxviz's {' and '.join(f'`{op}`' for op in held)} takes the whole" in md_text
    assert f"fused **{made['com.microsoft.SkipLayerNormalization']} of 5** norms" in md_text
    assert f"rlxviz fused **{final['FusedResidualLN']} of 5**" in md_text
    text, _ = t["transformer-optimizer"]  # live where it can run, else the recorded run of the same code
    assert text.startswith("RECORDED (2026-12-02" if unavailable else "MEASURED here: ONNX Runtime"), text
    assert "SkipLayerNormalization outputs per node: [2, 2, 2, 1] (3 also return the residual sum)" in text
    assert "LayerNormalization left: h.0.ln_1" in text
    assert ("recorded, not run here: " in md_text) == unavailable
    assert "fuses **4 of 5** norms, **3** of them with the sum as a second output" in md_text
    exercise_feedback(nb, t)
    assert "fill in all three values" in t["exercise"][0]
    assert "rlxviz: 5 is every norm in the model" in probe(t, "probe-every-norm")
    assert "epilogue_activation refused the FFN's activation, not a norm" in probe(t, "probe-activation-guard")
    assert "give a tuple of 3 values" in probe(t, "probe-two-values")
    assert "ort: 4 is what the transformer optimizer made" in probe(t, "probe-transformer-count")


def test_06_a_multi_output_fusion(executed):
    nb = executed("06_a_multi_output_fusion.ipynb")
    t = common(nb)
    text, _ = t["refusal"]
    assert text.count("sum_single_user (illegal): ") == 4
    assert "LayerNorms in the model: 5; fused by fuse_residual_ln: 1 (ln_f); refused: 4 of 5 LayerNorms" in text
    assert "compiler fix: a fuse_residual_ln rule that builds FusedResidualLN(with_sum=true)" in text
    assert re.search(r"^memory check \(run\): estimated peak ", text, re.M)
    text, _ = t["demo"]  # the packed value and its two narrows, read from the printed IR
    assert re.search(r"FusedResidualLN\(%0, %1, %3, %4\) \{eps=1e-12, has_bias=false, with_sum=true\} : "
                     r"f32\[2, 4, 16\]", text), text
    assert "['%9 narrow(start=0, length=8)', '%10 narrow(start=8, length=8)']" in text
    assert "%7 = add(%10, %6)" in text  # the next residual add reads the sum's narrow
    exercise_feedback(nb, t)
    text, _ = t["solution"]
    assert "4 norms fused with two outputs, verifier passed, outputs equal bit for bit" in text
    assert "post-LN untouched; the bias add refused by residual_same_shape (not recognized)" in text
    assert float(re.search(r"whole pipeline vs the ONNX import: (\S+)\)", text).group(1)) < 1e-6
    assert "declare outputs=('sum',)" in probe(t, "probe-no-outputs")
    assert "the residual sums are still computed by add nodes" in probe(t, "probe-norm-only")
    assert "on post-LN bert-tiny your pass fused" in probe(t, "probe-no-quiet")
    assert "only the engine's fused_types refused the bias add" in probe(t, "probe-no-same-shape")
    text, _ = t["after"]
    rows = dict((label, (int(g), int(p), int(k))) for label, g, p, k in re.findall(
        r"^(canonical|with two-output)\s+graph ops\s+(\d+)\s+MLX primitives\s+(\d+)\s+not views\s+(\d+)", text,
        re.M))
    counts = {label: eval(d) for label, d in re.findall(r"^(canonical|with two-output) .*?not views\s+\d+\s+(\{.*\})$",
                                                          text, re.M)}
    assert "'FusedResidualLN': 5" in text and "'layer_norm'" not in text.split("with two-output:")[1].splitlines()[0]
    md_text = markdown_of(nb, "after-read-aloud")  # the prose quotes the cell's own counts
    (g0, _, k0), (g1, _, k1) = rows["canonical"], rows["with two-output"]
    assert f"The graph went from {g0} to {g1} ops (4 adds and 4 norms became 4 fused ops and 8 `narrow`s)" in md_text
    assert f"MLX's program from {k0} to **{k1}** non-view primitives" in md_text
    concat = counts["with two-output"].get("Concatenate", 0) - counts["canonical"].get("Concatenate", 0)
    assert concat == 4 and f"'Concatenate': {concat}" in md_text  # one packing copy per fused norm
    assert ("More, not fewer: " in md_text) == (k1 > k0)
    assert all(len(k) < 60 for c in counts.values() for k in c), counts  # Compiled(...) kernels by their pieces
    ours = counts["with two-output"].get("RlxvizResidualLayerNorm", 0)
    assert ours == counts["canonical"].get("RlxvizResidualLayerNorm", 0)  # the one-output kernel: ln_f only
    assert f"`RlxvizResidualLayerNorm` x{ours} in both programs" in md_text
    assert "16384 B for the 4 norms (a **model** of that kernel" in md_text  # 4 sums of [1, 16, 64] f32



COUNTED = ("layer", "head", "norm", "match", "op", "add", "node", "primitive", "rejection", "output", "value", "byte")


def prose_figures(nb):
    """The figures a notebook's written (not computed) prose quotes, as (number, unit, counted noun): numbers
    outside section numbers, list markers, references (`notebook 05`, `01-04`, `§5.1`), with the unit that
    follows (`MB`, `B`, `ms`, `x`) and, for a small count, the noun it counts later in its sentence (`4 heads`,
    `4 of GPT-2's 5 LayerNorms`: norm)."""
    found = []
    for c in nb.cells:
        if c.cell_type != "markdown":
            continue
        text = re.sub(r"^#+ \d+\.|^\s*\d+\.\s", "", c.source, flags=re.M)  # section numbers, list markers
        text = re.sub(r"\b\d{4}-\d\d-\d\d\b", "", text)  # dates (when a figure was recorded)
        text = re.sub(r"\b(?:[Nn]otebooks? )?0\d(?:-0\d)?\b", "", text)  # notebook references
        for m in re.finditer(r"(?<![\w.%\[`§-])(\d+(?:\.\d+)?)(?![\w\]`])(?: ?(MB|B|ms|x)\b)?", text):
            rest = re.split(r"[.;:(]\s", text[m.end():], maxsplit=1)[0].lower()
            noun = next((w for w in re.findall(r"[a-z]+", rest) if any(w.startswith(k) or w.endswith(k + "s")
                                                                         for k in COUNTED)), "")
            found.append((m.group(1), m.group(2) or "", noun))
    return found


def assert_prose_figures_printed(nb, size_of=None):
    """Every figure of `prose_figures(nb)` is printed by a code cell of `nb` (or is a literal of its code): a count
    below 10 next to the noun it counts (within 40 characters), any other number (a version such as `0.32`
    included: the setup cell prints MLX's) anywhere; an `MB` figure is
    `size_of`'s bytes, printed, to one decimal."""
    shown = " ".join(o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values())
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    figures = prose_figures(nb)
    assert figures, "the prose quotes no figure: the grep is broken"
    for number, unit, noun in figures:
        if unit == "MB":  # a file size, printed in bytes
            assert size_of is not None and f"{size_of} bytes" in shown and abs(size_of / 1e6 - float(number)) < 0.05
        elif float(number) < 10 and noun and "." not in number:  # a count: a whole number
            stem = next(k for k in COUNTED if noun.startswith(k) or noun.endswith(k + "s"))
            near = rf"(?<![\d.]){number}(?![\d.]).{{0,40}}{stem}|{stem}.{{0,40}}(?<![\d.]){number}(?![\d.])"
            assert re.search(near, shown, re.I | re.S), f"prose says {number} ({noun}); no cell prints it"
        elif float(number) >= 10 or "." in number:
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", shown + " " + code), \
                f"prose says {number} {unit}; no cell prints it"


def test_prose_grep_fails_on_a_figure_no_cell_prints():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("It fused 3 of the 5 norms in 12.5 ms."),
                                         nbformat.v4.new_code_cell("print('fused norms: 3 of 5')")])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="fused norms: 3 of 5; 12.5 ms\n")]
    assert [f[:2] for f in prose_figures(nb)] == [("3", ""), ("5", ""), ("12.5", "ms")]
    assert_prose_figures_printed(nb)
    nb.cells[1].outputs[0].text = "fused norms: 2 of 5; 12.5 ms\n"
    with pytest.raises(AssertionError, match=r"prose says 3 \(norms\)"):
        assert_prose_figures_printed(nb)
    nb.cells[1].outputs[0].text = "fused norms: 3 of 5; 12.4 ms\n"
    with pytest.raises(AssertionError, match="prose says 12.5 ms"):
        assert_prose_figures_printed(nb)


@pytest.mark.parametrize("name", NAMES)
def test_prose_figures_are_printed_by_a_cell(executed, name):
    """Every figure the written prose of each notebook quotes is printed by a cell (or is a literal of its code: a
    recorded figure lives in a cell's table, not in the prose): a figure no cell computes would be a claim nobody
    checks (the computed paragraphs are checked against their cells in each notebook's test)."""
    assert_prose_figures_printed(executed(name), (ROOT / "tests" / "fixtures" / "onnx" / "gpt2.onnx").stat().st_size)


def test_teach_time_versions_makes_the_cli_memory_check():
    """The notebooks' timing is refused over the memory limit as `rlxviz time` is (`Limits.check(..., "time")`),
    before anything is allocated, with the same one-line message."""
    from rlxviz import teach
    from rlxviz.passes import Pipeline
    from rlxviz.session import LimitError, Limits

    model = teach.load("bert-tiny", seq=8)
    trace = Pipeline.canonical().run(model.graph)
    need = Limits().check(model.graph, "bert-tiny", "time")
    assert teach.check_memory(model.graph, "bert-tiny", "time").startswith("memory check (time): estimated peak ")
    small = Limits(need / (1 << 20) / 2, "test")  # half of what `time` needs, more than `load` needs
    assert Limits().check(model.graph, "bert-tiny", "load") < small.max_bytes
    with pytest.raises(LimitError, match=r"^bert-tiny: time needs .* over the limit of .* \(test\)"):
        teach.time_versions(trace, model.random_feeds(0), model.weights, source="bert-tiny", limits=small)


def test_03_quotes_the_eps_gap_as_explain_words_it(capsys):
    """Notebook 03's "truly illegal case" (eps outside the sqrt) once said no compiler could do anything, while
    `explain` calls the same refusal a gap in rlxviz's ops (a new op is the compiler fix): the notebook now quotes
    `explain`'s words, and they are what it prints today."""
    from clirun import run as cli_run

    src = next((NB_DIR / "src").glob("03_*.py")).read_text(encoding="utf-8")
    quoted = re.search(r'\("(rlxviz lacks std \+ eps[^"]+)"\)', " ".join(ln.lstrip("# ") for ln in src.splitlines()))
    assert quoted, "notebook 03 no longer quotes explain's gap words for eps outside the sqrt"
    code, out, _ = cli_run(capsys, "explain", NB_DIR.parent / "docs" / "examples" / "ln-eps-outside-sqrt.rlx")
    assert code == 0 and quoted.group(1) in out, (quoted.group(1), out)
