"""Record every case's outcome, and compare two records: the before/after check for a redesign step.

    python scripts/case_outcomes.py record OUT.json [--jobs 2] [--only SUBSTR]
    python scripts/case_outcomes.py compare BEFORE.json AFTER.json

`record` runs `rlxviz explain --json` (one process per file, as a user would) on the outside cases
(`../shared/cases/*.rlx`, `../shared/cases/onnx/*.onnx`), the test data (`tests/data/**/*.rlx`), the ONNX fixtures
and zoo (`tests/fixtures/onnx/**/*.onnx`) and the presets, and keeps for each: the exit code, the verdict, every
layer's fused flag and first rejection (rule, guard), and the final op counts. For an ONNX file with a sibling
`_io.npz`/`.npz`, `rlxviz run FILE --inputs NPZ -o TMP` is recorded too (its outputs checked against the npz's
`out:NAME` arrays) (its exit code and its last line), so a change in
the numbers' verdict shows. `compare` prints each file whose record differs, one line per difference, and exits 1
when any differs (0 when the records agree).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "cases"
PRESETS = ("bert-tiny", "minilm-shaped", "llama-block")
TIMEOUT_S = 300


def case_files() -> list[str]:
    """Every file (or preset name) whose outcome is recorded, in a fixed order."""
    files = sorted(SHARED.glob("*.rlx")) + sorted(SHARED.glob("onnx/*.onnx"))
    files += sorted((ROOT / "tests" / "data").rglob("*.rlx"))
    files += sorted((ROOT / "tests" / "fixtures" / "onnx").rglob("*.onnx"))
    return [str(f) for f in files] + list(PRESETS)


def _inputs_for(model: str) -> Path | None:
    p = Path(model)
    for cand in (p.with_name(p.stem + "_io.npz"), p.with_suffix(".npz")):
        if p.suffix == ".onnx" and cand.exists():
            return cand
    return None


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlxviz.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=ROOT)


def outcome(model: str) -> dict:
    """The recorded facts of one file: exit code, verdict, per-layer fused/first rejection, final op counts."""
    rec: dict = {}
    try:
        p = _cli("explain", model, "--json")
    except subprocess.TimeoutExpired:
        return {"explain": "timeout"}
    rec["explain_rc"] = p.returncode
    try:
        j = json.loads(p.stdout)
    except json.JSONDecodeError:
        rec["explain_err"] = (p.stderr.strip().splitlines() or [""])[-1][:300]
    else:
        rec["ok"] = j.get("ok")
        rec["fused_layers"] = j.get("fused_layers")
        rec["final_op_counts"] = j.get("final_op_counts")
        rec["layers"] = [
            {"layer": lay.get("layer"), "fused": lay.get("fused"),
             "first": None if not lay.get("first") else f"{lay['first'].get('rule')}:{lay['first'].get('guard')}"}
            for lay in j.get("layers", [])]
    npz = _inputs_for(model)
    if npz is not None:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                r = _cli("run", model, "--inputs", str(npz), "--output", str(Path(tmp) / "out.npz"))
                rec["run_rc"] = r.returncode
                rec["run_last"] = ((r.stdout + r.stderr).strip().splitlines() or [""])[-1][:300]
        except subprocess.TimeoutExpired:
            rec["run_rc"] = "timeout"
    return rec


def _key(model: str) -> str:
    """A name that is the same in every checkout: 'shared/cases/...', 'tests/...', or the preset's name."""
    p = Path(model).resolve()
    if p.is_relative_to(SHARED.resolve()):
        return str(Path("shared/cases") / p.relative_to(SHARED.resolve()))
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else model


def record(out: Path, jobs: int, only: str | None) -> None:
    files = [f for f in case_files() if only is None or only in f]
    with ThreadPoolExecutor(jobs) as pool:
        results = dict(zip(files, pool.map(outcome, files), strict=True))
    rel = {_key(k): v for k, v in results.items()}
    out.write_text(json.dumps(rel, indent=1, sort_keys=True))
    print(f"{len(rel)} outcome(s) -> {out}")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x == y:
            continue
        differ += 1
        if x is None or y is None:
            print(f"{name}: only in {'after' if x is None else 'before'}")
            continue
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                print(f"{name}: {key}: {json.dumps(x.get(key))} -> {json.dumps(y.get(key))}")
    print(f"{differ} of {len(set(a) | set(b))} file(s) differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--only")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.out, args.jobs, args.only)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
