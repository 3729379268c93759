"""App security rules: allowed checkpoint roots, upload limits, IR text limits; caches and the job runner."""

import os
import threading
from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import (
    ALLOWED_DIRS_ENV,
    IR_SUFFIXES,
    MAX_IR_CHARS,
    SourceError,
    allowed_dirs,
    check_checkpoint_dir,
    check_ir_text,
    check_path_kind,
    max_upload_bytes,
    save_upload,
)
from rlxviz.session.cache import LRUCache


def test_allowed_dirs_default_is_none(tmp_path):
    assert allowed_dirs({}) == []
    assert allowed_dirs({ALLOWED_DIRS_ENV: ""}) == []
    with pytest.raises(SourceError, match="disabled on this server"):
        check_checkpoint_dir("/etc", [])


def test_allowed_dirs_parses_and_resolves(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    env = {ALLOWED_DIRS_ENV: f"{a}{os.pathsep}{tmp_path}/b/../b{os.pathsep}{tmp_path}/missing"}
    assert allowed_dirs(env) == [a.resolve(), b.resolve()]


def test_checkpoint_dir_needs_a_path(tmp_path):
    with pytest.raises(SourceError, match="Type the path"):
        check_checkpoint_dir("  ", [tmp_path])
    assert check_checkpoint_dir(str(tmp_path), [tmp_path]) == [tmp_path]


def test_every_path_box_message_names_a_checkpoint_folder_and_an_onnx_file(tmp_path):
    """Issue 39: the path box's help and refusals named a checkpoint folder only; an .onnx file (its external data
    beside it) under the allowed folders opens too. Each message names both (a refusal of the box, the IR text file
    it opens as well); what opens is not refused."""
    from rlxviz.app.sources import where_big_files

    (tmp_path / "empty").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "w.pt").write_bytes(b"")  # refused before the load (the loader's refusal greyed the panes), saying why
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "weights.zip").write_bytes(b"PK")
    said = [where_big_files([]), where_big_files([tmp_path])]
    for call in (lambda: check_checkpoint_dir("/x", []), lambda: check_checkpoint_dir(" ", [tmp_path]),
                 *(lambda n=n: check_path_kind(str(tmp_path / n), [tmp_path]) for n in ("weights.zip", "empty",
                                                                                      "w.pt"))):
        with pytest.raises(SourceError) as e:
            call()
        said.append(str(e.value))
    for text in said:
        assert "checkpoint folder" in text and ".onnx file" in text, text
    for text in said[2:]:  # newcomer run 38: the box's own refusals name the IR text file it opens too
        assert "IR text file (.ir, .rlx, .txt)" in text, text
    for ok in ("ckpt", "ckpt/config.json", "m.onnx", "notes.txt"):
        check_path_kind(str(tmp_path / ok), [tmp_path])


def test_upload_limits_and_files(tmp_path):
    with pytest.raises(SourceError, match="at most"):
        save_upload({"config.json": b"{}", "model.safetensors": b"x" * 100}, limit=50)
    with pytest.raises(SourceError, match="exactly two files"):
        save_upload({"config.json": b"{}"}, limit=1000)
    with pytest.raises(SourceError, match="exactly two files"):
        save_upload({"a.json": b"{}", "b.json": b"{}", "m.safetensors": b"x"}, limit=1000)
    folder = save_upload({"my-config.json": b'{"a": 1}', "weights.safetensors": b"abc"}, limit=1000)
    try:
        assert (folder / "config.json").read_bytes() == b'{"a": 1}'
        assert (folder / "model.safetensors").read_bytes() == b"abc"
        assert oct(folder.stat().st_mode)[-3:] == "700"
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_max_upload_env():
    assert max_upload_bytes({}) == 200 * 2**20
    assert max_upload_bytes({"RLXVIZ_MAX_UPLOAD_MB": "1.5"}) == int(1.5 * 2**20)
    assert max_upload_bytes({"RLXVIZ_MAX_UPLOAD_MB": "lots"}) == 200 * 2**20


def test_ir_text_limits():
    with pytest.raises(SourceError, match="empty"):
        check_ir_text("  \n")
    with pytest.raises(SourceError, match="limit"):
        check_ir_text("x" * (MAX_IR_CHARS + 1))
    assert check_ir_text("graph g {}") == "graph g {}"


def test_lru_cache_evicts_and_computes_once():
    c = LRUCache(maxsize=2)
    calls = []
    for k in (1, 2, 1, 3):
        c.get_or_compute(k, lambda k=k: calls.append(k) or k * 10)
    assert calls == [1, 2, 3]
    assert 2 not in c and 1 in c and 3 in c
    assert c.hits == 1 and c.misses == 3


def test_lru_cache_races_compute_once():
    c = LRUCache()
    started = threading.Barrier(4)
    calls = []

    def work():
        started.wait()
        c.get_or_compute("k", lambda: calls.append(1) or sum(range(10**5)))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]


def test_runner_inline_and_background_skip_stale():
    r = Runner(background=False)
    assert r.submit("x", lambda: 42).result() == 42
    bg = Runner(background=True)
    gate = threading.Event()
    done = []
    bg.submit("block", gate.wait)
    first = bg.submit("load", lambda: done.append("first"))
    second = bg.submit("load", lambda: done.append("second"))
    gate.set()
    second.result(5)
    first.result(5)
    assert done == ["second"]


def test_work_ahead_runs_beside_a_page_and_is_skipped_inline():
    """Drawing versions ahead of a request pays while a page stays usable; inline it only delays the caller."""
    ran = []
    assert Runner(background=False).submit("prerender", lambda: ran.append(1), ahead=True).result() is None
    assert ran == []
    Runner(background=True).submit("prerender", lambda: ran.append(2), ahead=True).result(5)
    assert ran == [2]


def test_runner_on_page_runs_state_changes_on_the_page_thread():
    """A job's state changes run on the page's thread, in order, the job waiting for each (their exceptions
    come back to the job); with no page, or a closed one, they run inline."""
    import queue

    calls: queue.Queue = queue.Queue()
    alive = threading.Event()
    alive.set()
    page_thread = threading.Thread(target=lambda: [fn() for fn in iter(calls.get, None)], daemon=True)
    r = Runner(background=True, page=(calls.put, alive.is_set))
    page_thread.start()
    try:
        seen = []

        def job():
            seen.append(("job", threading.current_thread() is page_thread))
            seen.append(("step", r.on_page(lambda: threading.current_thread() is page_thread)))
            try:
                r.on_page(lambda: 1 / 0)
            except ZeroDivisionError:
                seen.append(("raised", True))
            return r.on_page(lambda: 7)

        assert r.submit("load", job).result(5) == 7
        assert seen == [("job", False), ("step", True), ("raised", True)]
        assert r.on_page(threading.current_thread) is threading.current_thread()  # the runner's maker: inline
        alive.clear()
        assert r.submit("load", lambda: r.on_page(threading.current_thread)).result(5) is not page_thread
        calls.put(None)
        page_thread.join(5)
        alive.set()
        blocked = r.submit("load", lambda: r.on_page(lambda: 9, poll_s=0.05))  # queued on a page that stopped
        alive.clear()  # ... and then closed: the step runs inline
        assert blocked.result(5) == 9
    finally:
        calls.put(None)
    assert Runner(background=True).on_page(lambda: 3) == 3  # no page: inline


def test_no_eval_or_pickle_in_app():
    src = "\n".join(p.read_text() for p in Path("rlxviz/app").glob("*.py"))
    for banned in (" eval(", " exec(", "import pickle", "pickle.load", "allow_pickle=True"):
        assert banned not in src, banned


@pytest.mark.parametrize("name, goes", [
    ("roberta_io.npz", "Timing tab's Your inputs (.npz)"),
    ("n4-15-residual-logged.rlx", "IR text goes in the IR editor tab"),
    ("graph.ir", "IR text goes in the IR editor tab"),
    ("model.onnx_data", "external data is read in place"),
])
def test_upload_and_path_box_say_where_a_wrong_kind_goes(tmp_path, name, goes):
    """The Upload source and the path box given a file of another kind (inputs, IR text, external data) say where
    its kind goes instead, in the drop zone's words (`dropped_elsewhere`); they said only what they take. The path
    box takes an IR text file."""
    from rlxviz.app.sources import check_upload, dropped_elsewhere

    assert goes in dropped_elsewhere([name])  # the one wording the three share
    with pytest.raises(SourceError) as up:
        check_upload({name: b"x"}, limit=1000)
    assert goes in str(up.value) and name in str(up.value)
    with pytest.raises(SourceError) as up2:  # beside an .onnx file too
        check_upload({"m.onnx": b"x", name: b"x"}, limit=1000)
    assert goes in str(up2.value)
    (tmp_path / name).write_bytes(b"x")
    if name.endswith(IR_SUFFIXES):  # newcomer run 38: the path box opens an IR text file itself, as the CLI does
        assert check_path_kind(str(tmp_path / name), [tmp_path]) is None
        return
    with pytest.raises(SourceError) as box:
        check_path_kind(str(tmp_path / name), [tmp_path])
    assert goes in str(box.value) and "checkpoint folder" in str(box.value)


def test_upload_of_a_plain_wrong_file_adds_no_hint(tmp_path):
    """A file of no known kind keeps the plain refusal: no hint is made up for it."""
    from rlxviz.app.sources import check_upload

    with pytest.raises(SourceError) as up:
        check_upload({"notes.zip": b"x"}, limit=1000)
    assert "goes in" not in str(up.value) and "(got: notes.zip)" in str(up.value)
