"""Where a model may come from, and the security rules for paths and uploads (no Panel import).

* Checkpoint folders, `.onnx` files (read in place with their external data, never copied through the browser:
  the road for models too big to upload) and IR text files are accepted only *inside* directories listed in the
  environment variable `RLXVIZ_ALLOWED_DIRS` (`os.pathsep`-separated, e.g. `/data/models:/srv/ckpt`). Unset or
  empty means no folder is allowed: the app never reads an arbitrary server path. Paths are resolved
  (symlinks, `..`) before the check, so `allowed/../../etc` is refused.
* Uploads (`config.json` + `model.safetensors`) are size-limited (`RLXVIZ_MAX_UPLOAD_MB`, default
  200 MB in total), written to a fresh private temporary folder and read with `safetensors` and
  `json` only: no pickle, no `eval`.
* IR text is parsed by `rlxviz.ir.parse_ir` (a tokenizer + recursive descent parser), never evaluated,
  and limited to `MAX_IR_CHARS`, pasted or typed in the path box as an IR text file under the allowed directories
  (its size checked before it is read, `check_ir_size`; then read as the CLI reads it, `session.load`).
* How much a loaded graph may declare is the session's limits record (`rlxviz.session.Limits`,
  `RLXVIZ_MAX_MEMORY_MB`), the same for the app, the CLI and the notebooks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..models.checkpoint import PICKLE_SUFFIXES
from ..models.onnx.dims import DimError, parse_dim
from ..models.onnx.layout import onnx_layout_error
from ..session.loading import IR_SUFFIXES as _LOADER_IR_SUFFIXES

ALLOWED_DIRS_ENV = "RLXVIZ_ALLOWED_DIRS"
MAX_UPLOAD_ENV = "RLXVIZ_MAX_UPLOAD_MB"
DEFAULT_MAX_UPLOAD_MB = 200
MAX_CONFIG_BYTES = 1 << 20
MAX_IR_CHARS = 2_000_000
DIMS_EXAMPLE = "num_channels=3 height=224 width=224"
"""The Input dims box's example (an image model's `pixel_values` dims), shown until a model asks for its own."""


class SourceError(ValueError):
    """A model source was refused or could not be read; the message says what to do."""


def parse_dims(text: str) -> tuple[tuple[str, int], ...]:
    """The sidebar's Input dims box (`num_channels=3 height=224 width=224`, commas or spaces between pairs) as
    `OpenRequest.dims`.

    Raises:
        SourceError: a pair that is not NAME=N with N a positive whole number (naming it).
    """
    pairs = []
    for item in text.replace(",", " ").split():
        try:
            pairs.append(parse_dim(item))
        except DimError:
            raise SourceError(f"Input dims: {item[:80]!r} is not NAME=N with N a positive whole number (e.g. "
                              f"{DIMS_EXAMPLE}).") from None
    return tuple(pairs)


def allowed_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """The resolved directories checkpoint folders may live in (from `RLXVIZ_ALLOWED_DIRS`).

    Args:
        env: environment mapping to read (default `os.environ`).

    Returns:
        Existing directories, resolved; an empty list when the variable is unset or empty.
    """
    raw = (env if env is not None else os.environ).get(ALLOWED_DIRS_ENV, "")
    out = []
    for part in raw.split(os.pathsep):
        part = part.strip()
        if part:
            p = Path(part).expanduser().resolve()
            if p.is_dir():
                out.append(p)
    return out


def _env_mb(name: str, default: float, env: dict[str, str] | None) -> int:
    """A size limit in bytes from environment variable `name` (in MB; unset or invalid: `default`)."""
    raw = (env if env is not None else os.environ).get(name, "")
    try:
        mb = float(raw) if raw.strip() else default
    except ValueError:
        mb = default
    return int(max(mb, 0) * (1 << 20))


def max_upload_bytes(env: dict[str, str] | None = None) -> int:
    """Total upload limit in bytes (`RLXVIZ_MAX_UPLOAD_MB`, default 200 MB)."""
    return _env_mb(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_MB, env)


PATH_BOX = "the Folder source's path box"
"""Where the app takes a typed server path: a checkpoint folder, an `.onnx` file (with its external data), or an IR
text file (`IR_SUFFIXES`, read as the CLI reads it)."""
PATH_TAKES = ("a Hugging Face BERT checkpoint folder (it holds config.json and model.safetensors), an .onnx file "
              f"(its external data beside it) or an IR text file ({', '.join(_LOADER_IR_SUFFIXES)})")
"""What `PATH_BOX` opens, in words: every message about the box names all three (issue 39: they named the folder
only, though an `.onnx` file under the allowed folders opens too; newcomer run 38: an `.rlx` file the CLI takes
was refused by the box)."""


def where_big_files(allowed: list[Path] | None = None) -> str:
    """One sentence saying where a file too big to upload goes instead: a path under the allowed folders, typed in
    the Folder source's box (read on the server, never copied through the browser); with no allowed folder, how the
    server is started to have one. The sentence stands on its own after the upload limit ("... at most 200 MB. A
    bigger model is opened by path instead: ..."), in the upload area and in the message refusing an upload over it.

    Args:
        allowed: allowed roots (default `allowed_dirs()`).
    """
    roots = allowed_dirs() if allowed is None else allowed
    if roots:
        return (f"A bigger model is opened by path instead: put the .onnx file (and its external data) or the "
                f"checkpoint folder under {roots[0]} on the server and type its path in {PATH_BOX}, where it is read, "
                "not uploaded.")
    return (f"A bigger model is opened by path instead: start the server with {ALLOWED_DIRS_ENV}=/path/to/models, put "
            f"the .onnx file (and its external data) or the checkpoint folder there and type its path in {PATH_BOX}.")


MODEL_DROP_SUFFIXES = (".onnx", ".json", ".safetensors")
"""What the model drop zone (and the Upload source) takes, by suffix: one `.onnx` file, or a checkpoint's
`config.json` + `model.safetensors` (`check_upload`)."""
DROP_TAKES = "one .onnx file (its weights inside) or a checkpoint's config.json + model.safetensors"
"""`MODEL_DROP_SUFFIXES` in words."""
IR_SUFFIXES = _LOADER_IR_SUFFIXES
"""IR text files (the loader's list), read by the IR editor's file box (`ModelControls.ir_file`), not by the drop
zone."""


def names_ir_file(path: str) -> bool:
    """Whether `path` (as typed in the path box) names an IR text file by its suffix (`IR_SUFFIXES`, any case): the
    one test the path box's checks, the shape controls and the variant's drop reason read."""
    return path.strip().lower().endswith(IR_SUFFIXES)


def names_onnx_file(path: str) -> bool:
    """Whether `path` (a path as typed, or a file name) names an `.onnx` file by its suffix (any case), as
    `names_ir_file` does IR text: the test the path box's checks, the Input dims box and the loads read."""
    return path.strip().lower().endswith(".onnx")


EXTERNAL_DATA_SUFFIXES = (".data", ".onnx_data", ".onnx.data", ".weight", ".weights")
"""Files an `.onnx` file's external data is commonly stored in: read in place, by path, never uploaded."""


def dropped_elsewhere(names: list[str]) -> str:
    """One line for files dropped on the model drop zone that it does not take: what was received, where each kind
    goes instead (an `.npz` of inputs: the Timing tab; IR text: the IR editor tab; an `.onnx` file's external data:
    its path in the Folder source; a pickled checkpoint: never opened) and what the zone takes (`DROP_TAKES`). The
    names are the user's, shown as text by the message pane (which escapes them). Raises nothing.

    Example:
        >>> dropped_elsewhere(["notes.txt"])  # doctest: +ELLIPSIS
        "Dropped notes.txt: not taken (IR text goes in the IR editor tab). The drop zone takes one .onnx file ..."
    """
    hints = kind_goes(names) or ["not a model file"]
    return f"Dropped {', '.join(names)}: not taken ({'; '.join(hints)}). The drop zone takes {DROP_TAKES}."


def kind_goes(names: list[str]) -> list[str]:
    """Where each of `names`' kinds goes instead of the model drop zone, the Upload source or the path box, in the
    words all three say it (`dropped_elsewhere`, `check_upload`, `check_path_kind`): an `.npz` of inputs, IR text
    (`IR_SUFFIXES`), an `.onnx` file's external data, a pickled checkpoint. One phrase per kind present, [] when
    none of them is (a model file, or a file of no known kind). Raises nothing.

    Example:
        >>> kind_goes(["roberta_io.npz", "model.onnx"])
        ["an .npz of inputs goes in the Timing tab's Your inputs (.npz)"]
    """
    low = [n.lower() for n in names]
    hints = []
    if any(n.endswith(".npz") for n in low):
        hints.append("an .npz of inputs goes in the Timing tab's Your inputs (.npz)")
    if any(n.endswith(IR_SUFFIXES) for n in low):
        hints.append("IR text goes in the IR editor tab")
    if any(n.endswith(EXTERNAL_DATA_SUFFIXES) for n in low):
        hints.append(f"an .onnx file's external data is read in place: type the .onnx file's path in {PATH_BOX}")
    if any(n.endswith(PICKLE_SUFFIXES) for n in low):
        hints.append("a pickled checkpoint is never opened, as it could run code: convert it to model.safetensors")
    return hints


def _goes(names: list[str]) -> str:
    """`kind_goes` as a clause after a refusal ("; an .npz of inputs goes in ..."), '' when no kind is known."""
    hints = kind_goes(names)
    return f"; {'; '.join(hints)}" if hints else ""


def check_checkpoint_dir(path: str, allowed: list[Path] | None = None) -> list[Path]:
    """Refuse early, with what to do, when folders are disabled or nothing was typed.

    The folder itself is resolved and checked against the roots by the checkpoint loader
    (`rlxviz.models.checkpoint.resolve_folder`), which the caller passes these roots to.

    Args:
        path: the folder the user typed.
        allowed: allowed roots (default `allowed_dirs()`).

    Returns:
        The allowed roots to hand to the loader.

    Raises:
        SourceError: no allowed directories are configured, or `path` is empty.
    """
    roots = allowed_dirs() if allowed is None else allowed
    if not roots:
        raise SourceError(f"Paths (checkpoint folders, .onnx and IR text files) are disabled on this server. Start "
                          f"it with {ALLOWED_DIRS_ENV}=/path/to/models (a list separated by ':') to open {PATH_TAKES} "
                          "inside those directories by path, or upload one .onnx file (its weights inside) or "
                          "config.json + model.safetensors instead.")
    if not path.strip():
        raise SourceError(f"Type the path of {PATH_TAKES}, inside {', '.join(map(str, roots))}.")
    return roots


def check_path_kind(path: str, allowed: list[Path]) -> None:
    """Refuse a path to open (one `check_in_roots` passed: inside the roots, existing) that is neither a checkpoint
    folder, an `.onnx` file nor an IR text file (`IR_SUFFIXES`), before any load, naming all three (`PATH_TAKES`): a
    file of another kind (a `.zip`, a `.md`) read "not a folder; give the folder holding config.json and
    model.safetensors", and a folder without `config.json` "no config.json (a Hugging Face checkpoint folder needs
    one)", neither naming the `.onnx` option. An IR text file over the IR text limit (`check_ir_size`, the limit on
    pasted text) is refused here, from its size, before it is read. A checkpoint's `config.json` names its folder (as
    `session.load` takes it). A pickled checkpoint (`PICKLE_SUFFIXES`) and a path that is neither a file nor a
    folder (a device, a pipe) are refused here too, in the loader's words: the loader refused them after the load
    had begun, and the panes of the model still shown were marked stale (greyed) though nothing was loaded.

    Args:
        path: the path the loader would open (`resolve_in_roots`'s answer).
        allowed: the allowed roots, named in the message.

    Raises:
        SourceError: `path` is a file other than `.onnx`, an IR text file or `config.json` (a pickle: why it is
            never opened), an IR text file over `MAX_IR_CHARS` bytes, a folder without `config.json`, or neither a
            file nor a folder.
    """
    real = Path(path).expanduser().resolve()
    where = ", ".join(map(str, allowed))
    if real.is_file():
        name = real.name.lower()
        if name.endswith(PICKLE_SUFFIXES):
            raise SourceError(f"{path}: refusing pickled checkpoint {real.name}: loading a pickle can execute "
                              "arbitrary code, so it is never opened; convert it to model.safetensors (the path box "
                              f"opens {PATH_TAKES}).")
        if names_onnx_file(name) or name == "config.json":
            return
        if names_ir_file(name):
            check_ir_size(path, real.stat().st_size)
            return
        raise SourceError(f"{path}: neither a checkpoint folder, an .onnx file nor an IR text file"
                          f"{_goes([real.name])}; the path box opens {PATH_TAKES}, inside {where}.")
    if real.exists() and not real.is_dir():
        raise SourceError(f"{path}: neither a file nor a folder; the path box opens {PATH_TAKES}, inside {where}.")
    if real.is_dir() and not (real / "config.json").is_file():
        onnx = sorted(f.name for f in real.iterdir() if f.suffix.lower() == ".onnx" and f.is_file())[:3]
        held = f" (it holds {', '.join(onnx)}: type that file's path)" if onnx else ""
        raise SourceError(f"{path}: a folder without config.json, so no checkpoint folder{held}; the path box opens "
                          f"{PATH_TAKES}, inside {where}.")


def resolve_in_roots(path: str, allowed: list[Path]) -> str:
    """A typed path as the loader should open it: an absolute path (or `~`) as typed; a relative one (`onnx/x.onnx`)
    against the allowed folder that holds it (it was resolved against the server's working folder and refused as
    outside the allowed folders, though the one allowed folder held it).

    A candidate counts only when it exists and its real path (symlinks and `..` resolved) lies inside the folder it
    was joined to, so `../etc/passwd` or a link out of the folder is no candidate; the loader checks the roots again.

    Args:
        path: what the user typed.
        allowed: the allowed roots (resolved, `allowed_dirs()`).

    Returns:
        The path to open: the one allowed folder's candidate, as an absolute path; else `path` unchanged (the loader
        refuses it, or finds it from the working folder inside a root as before).

    Raises:
        SourceError: the relative path names a file or folder in more than one allowed folder (which one is meant is
            not guessed: type the full path).
    """
    typed = path.strip()
    rel = Path(typed)
    if not typed or rel.expanduser().is_absolute():
        return path
    found = []
    for root in allowed:
        real = (root / rel).resolve()
        if real.exists() and real.is_relative_to(root):
            found.append(root / rel)
    if len(found) > 1:
        raise SourceError(f"{typed} is in more than one allowed folder ({', '.join(str(p) for p in found)}); type the "
                          "full path of the one you mean.")
    return str(found[0]) if found else path


def check_in_roots(path: str, allowed: list[Path]) -> None:
    """Refuse a path to open (`resolve_in_roots`'s answer) that resolves outside the allowed roots or names nothing,
    before any load starts: such a path is refused, not a failed load (the model shown stays current, unmarked).

    The loader checks the roots again (`rlxviz.models.checkpoint.resolve_folder`, `session.loading`); this check
    only moves the refusal before the load. Outside the roots is said before existence, so a path outside them
    reveals nothing about what exists there. A relative path (as typed, not found by `resolve_in_roots`) is outside
    only when it lies outside every root joined to it too; else it is missing, and the message names where it looked
    (`onnx/x.onnx: no such file or folder (looked in /models/onnx/x.onnx)`), as the CLI says of a missing MODEL.

    Args:
        path: the path the loader would open (absolute, or relative to the server's working folder).
        allowed: the allowed roots.

    Raises:
        SourceError: `path` resolves outside every root ("outside the allowed model folders (...)"), or inside one
            but no file or folder is there ("no such file or folder", and for a relative path where it looked).
    """
    typed = Path(path).expanduser()
    real = typed.resolve()
    roots = [Path(r).expanduser().resolve() for r in allowed]
    if not any(real.is_relative_to(r) for r in roots):
        # a relative path that names nothing yet lies inside an allowed folder once joined to it (`resolve_in_roots`
        # looks there): missing there, not outside (symlinks and `..` resolved, so an escape is still outside)
        looked = [] if typed.is_absolute() else [r / typed for r in roots if (r / typed).resolve().is_relative_to(r)]
        if looked and not any(p.exists() for p in looked):
            raise SourceError(f"{path}: no such file or folder (looked in {', '.join(map(str, looked))})")
        raise SourceError(f"{path}: outside the allowed model folders ({', '.join(map(str, roots)) or 'none'})")
    if not real.exists():
        raise SourceError(f"{path}: no such file or folder")


ONNX_UPLOAD_NAME = "model.onnx"
"""The name an uploaded `.onnx` file is stored under in its temp folder."""


def save_upload(files: dict[str, bytes], limit: int | None = None) -> Path:
    """Validate uploaded `config.json` + `model.safetensors` (or one `.onnx` export with its weights inside)
    and write them to a new private temp folder (`check_upload`, then `store_upload`).

    Args:
        files: file name -> content, as a file-upload widget gives them (names are matched by suffix:
            `*.json` is the config, `*.safetensors` the weights).
        limit: total size limit in bytes (default `max_upload_bytes()`).

    Returns:
        A temp folder holding `config.json` and `model.safetensors`, or `model.onnx` (the caller may delete it).

    Raises:
        SourceError: a missing or extra file, or too large. The contents are checked by the loader.
    """
    return store_upload(check_upload(files, limit))


def check_upload(files: dict[str, bytes], limit: int | None = None) -> dict[str, bytes]:
    """The files of a valid upload under the names the loader reads (`config.json` + `model.safetensors`, or
    `model.onnx`), nothing written.

    Raises:
        SourceError: a missing or extra file, too large (as `save_upload`), or an `.onnx` file whose top-level
            layout is no ONNX model's (`onnx_layout_error`: truncated, not protobuf, no graph).
    """
    limit = max_upload_bytes() if limit is None else limit
    total = sum(len(v) for v in files.values())
    if total > limit:
        raise SourceError(f"The upload is {total / 2**20:.1f} MB; this server accepts at most {limit / 2**20:.0f} MB "
                          f"({MAX_UPLOAD_ENV}). {where_big_files()}")
    onnx_files = [v for k, v in files.items() if names_onnx_file(k)]
    if onnx_files:
        if len(files) != 1:
            raise SourceError("Upload one .onnx file alone (with its weights inside; external data files cannot be "
                              f"uploaded), or config.json + model.safetensors (got: {', '.join(sorted(files))}"
                              f"{_goes(sorted(files))}).")
        name = next(k for k in files if names_onnx_file(k))
        if why := onnx_layout_error(onnx_files[0]):  # refused here, before any field changes: no load, no stale mark
            raise SourceError(f"{name}: not a readable ONNX model ({why}).")
        return {ONNX_UPLOAD_NAME: onnx_files[0]}
    cfg = [v for k, v in files.items() if k.lower().endswith(".json")]
    st = [v for k, v in files.items() if k.lower().endswith(".safetensors")]
    if len(cfg) != 1 or len(st) != 1:
        raise SourceError("Upload one .onnx file alone, or exactly two files: the checkpoint's config.json and "
                          f"model.safetensors (got: {', '.join(sorted(files)) or 'nothing'}{_goes(sorted(files))}).")
    if len(cfg[0]) > MAX_CONFIG_BYTES:
        raise SourceError("config.json is larger than 1 MB; that is not a Hugging Face config.")
    return {"config.json": cfg[0], "model.safetensors": st[0]}


UPLOAD_PREFIX = "rlxviz-upload-"
"""Name prefix of the temp folders an upload is written to while a load reads it: `rlxviz-upload-PID-XXXX`, PID
the server process that owns it (`remove_uploads` and `remove_stale_uploads` read it)."""


def _upload_owner(folder: Path) -> int | None:
    """The pid in an upload folder's name (`rlxviz-upload-PID-...`), else None."""
    head = folder.name[len(UPLOAD_PREFIX):].split("-", 1)[0]
    return int(head) if folder.name.startswith(UPLOAD_PREFIX) and head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_uploads(owner: int | None = None, root: Path | None = None) -> list[Path]:
    """Remove the upload folders of server process `owner` (default: this one) under `root` (default: the temp
    folder). Returns what was removed. Called when the server stops (SIGTERM), so no user's file stays behind."""
    owner = os.getpid() if owner is None else owner
    root = Path(tempfile.gettempdir()) if root is None else root
    gone = [f for f in root.glob(UPLOAD_PREFIX + "*") if f.is_dir() and _upload_owner(f) == owner]
    for f in gone:
        shutil.rmtree(f, ignore_errors=True)
    return gone


def remove_stale_uploads(root: Path | None = None) -> list[Path]:
    """Remove the upload folders whose server process is gone (killed before it could clean up) under `root`
    (default: the temp folder), and those without an owner in their name (written before owners were recorded).
    Returns what was removed. Called at server start."""
    root = Path(tempfile.gettempdir()) if root is None else root
    gone = [f for f in root.glob(UPLOAD_PREFIX + "*")
            if f.is_dir() and ((pid := _upload_owner(f)) is None or not _alive(pid))]
    for f in gone:
        shutil.rmtree(f, ignore_errors=True)
    return gone


def store_upload(files: dict[str, bytes]) -> Path:
    """Write `check_upload`'s files to a new private temp folder (`UPLOAD_PREFIX`...; mode 0700); the caller removes
    it (`AppState` does once the load that reads it has ended, whether it failed or not).

    Raises:
        SourceError: the folder could not be written (it is removed).
    """
    folder = Path(tempfile.mkdtemp(prefix=f"{UPLOAD_PREFIX}{os.getpid()}-"))
    try:
        for name, data in files.items():
            (folder / name).write_bytes(data)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise SourceError(f"could not store the upload on the server: {e}") from None
    return folder


def check_ir_size(path: str, size: int) -> None:
    """Refuse an IR text file of `size` bytes typed in the path box before it is read, when it could hold more than
    the IR text limit (`MAX_IR_CHARS`, the limit on text pasted in the IR editor, `check_ir_text`): a character
    is at least one byte, so a file within the limit in bytes is within it in characters.

    Raises:
        SourceError: `size > MAX_IR_CHARS` (naming the file, its size and the limit).
    """
    if size > MAX_IR_CHARS:
        raise SourceError(f"{path}: {size} bytes of IR text; the limit is {MAX_IR_CHARS} (as on IR text pasted in "
                          "the IR editor), so it was not read.")


def check_ir_text(text: str) -> str:
    """Size check for typed or uploaded IR text. Raises SourceError when empty or too long."""
    if not text.strip():
        raise SourceError("The IR text is empty. Type or upload a graph, e.g. the IR tab of a preset.")
    if len(text) > MAX_IR_CHARS:
        raise SourceError(f"The IR text has {len(text)} characters; the limit is {MAX_IR_CHARS}.")
    return text
