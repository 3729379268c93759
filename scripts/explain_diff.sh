#!/usr/bin/env bash
# Before/after check of `rlxviz explain` verdicts on every outside case (issue 38): run it once per source tree
# and diff the two result folders.
#   scripts/explain_diff.sh SRC OUT     # SRC: a checkout of rlxviz (e.g. `git archive BASE | tar -x -C /tmp/base`)
#   diff -r OUT_BEFORE OUT_AFTER        # each case: its exit code, then its text
# Cases: ../shared/cases/*.rlx and the ONNX exports under ../shared/cases/onnx (CASES overrides the folder).
set -u
src=$(cd "$1" && pwd); out=$2; cases=${CASES:-/work/shared/cases}
py=${PY:-/work/main/.venv/bin/python}
mkdir -p "$out"
for f in "$cases"/*.rlx "$cases"/onnx/*.onnx; do
  [ -e "$f" ] || continue
  name=$(basename "$f")
  ( cd "$src" && PYTHONPATH="$src" timeout 300 "$py" -m rlxviz.cli explain "$f" >"$out/$name.txt" 2>&1
    echo "exit $?" >>"$out/$name.txt" )
done
