"""`rlxviz run`: subprocess (`python -m rlxviz`) and in-process, good and bad inputs."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlxviz import cli
from rlxviz.models import load_model, tokenize
from rlxviz.runtime import run_reference

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
FIX = ROOT / "tests" / "fixtures"


def rlxviz(*args):
    return subprocess.run([str(PY if PY.exists() else sys.executable), "-m", "rlxviz", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


HF_CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 50, "hidden_size": 16,
             "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_layers": 2,
             "max_position_embeddings": 20, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}


def tiny_checkpoint(folder, nan=(), drop=()):
    """A 2-layer Hugging Face BERT checkpoint folder (random weights, `[out, in]` linears); tensors named in
    `nan` are all NaN, those in `drop` are left out."""
    import json

    from safetensors.numpy import save_file

    from rlxviz.models import BertConfig, build_bert
    from rlxviz.models.bert import random_weights

    cfg = BertConfig(vocab_size=50, hidden=16, heads=2, intermediate=32, layers=2, max_position=20)
    t = {}
    for name, arr in random_weights(build_bert(cfg, 1, 4, style="hf"), seed=7).items():
        t[name] = np.ascontiguousarray(arr.T) if arr.ndim == 2 and not name.startswith("embeddings.") else arr
        if name in nan:
            t[name] = np.full_like(t[name], np.nan)
    for name in drop:
        del t[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    save_file(t, str(folder / "model.safetensors"))
    return folder


def one_line_error(stderr, fragment):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("rlxviz run: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in stderr


def test_subprocess_minilm_matches_fixture(tmp_path):
    ref = np.load(FIX / "minilm_reference.npz")
    inp = tmp_path / "in.npz"
    np.savez(inp, input_ids=ref["input_ids"], attention_mask=ref["attention_mask"])
    r = rlxviz("run", "minilm", "--inputs", inp, "-o", tmp_path / "out.npz", "--backend", "reference")
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    assert out.files == ["last_hidden_state"]
    h = out["last_hidden_state"]
    assert h.dtype == np.float32 and h.shape == ref["last_hidden_state"].shape
    assert np.abs(h - ref["last_hidden_state"]).max() <= 1e-4


def test_in_process_checkpoint_folder_and_rlx_style(tmp_path, capsys):
    from rlxviz.models import minilm_dir

    feeds = tokenize(["The quick brown fox.", "Jumps."], 7)
    np.savez(tmp_path / "in.npz", **feeds)
    assert cli.main(["run", str(minilm_dir()), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "a.npz")]) == 0
    assert "last_hidden_state float32 2x7x384" in capsys.readouterr().err  # its name and dtype
    assert cli.main(["run", "minilm", "--style", "rlx", "-q", "-i", str(tmp_path / "in.npz"),
                     "-o", str(tmp_path / "b.npz")]) == 0
    assert capsys.readouterr().err == ""
    a, b = np.load(tmp_path / "a.npz")["last_hidden_state"], np.load(tmp_path / "b.npz")["last_hidden_state"]
    assert a.shape == (2, 7, 384) and np.abs(a - b).max() < 1e-4


def test_in_process_presets_bert_and_llama(tmp_path):
    m = load_model("bert-tiny", batch=3, seq=5, style="hf")
    feeds = m.random_feeds(seed=2)
    np.savez(tmp_path / "in.npz", **feeds)
    assert cli.main(["run", "bert-tiny", "-q", "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    want = run_reference(m.graph, feeds, m.weights)[0]
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["last_hidden_state"], want)

    x = np.random.default_rng(0).standard_normal((2, 9, 64)).astype(np.float32)
    np.savez(tmp_path / "h.npz", hidden_states=x)
    assert cli.main(["run", "llama-block", "-q", "-i", str(tmp_path / "h.npz"), "-o", str(tmp_path / "l.npz")]) == 0
    ll = load_model("llama-block", batch=2, seq=9)
    np.testing.assert_array_equal(np.load(tmp_path / "l.npz")["last_hidden_state"],
                                  run_reference(ll.graph, {"hidden_states": x}, ll.weights)[0])


def _bad_cases(tmp_path):
    good = tokenize(["hello world"], 6)
    np.savez(tmp_path / "good.npz", **good)
    np.savez(tmp_path / "wrongkeys.npz", ids=good["input_ids"], mask=good["attention_mask"])
    np.savez(tmp_path / "nomask.npz", input_ids=good["input_ids"])
    np.savez(tmp_path / "float.npz", input_ids=good["input_ids"].astype(np.float32),
             attention_mask=good["attention_mask"])
    np.savez(tmp_path / "shape.npz", input_ids=good["input_ids"], attention_mask=good["attention_mask"][:, :4])
    np.savez(tmp_path / "vocab.npz", input_ids=good["input_ids"] + 40000, attention_mask=good["attention_mask"])
    np.savez(tmp_path / "mask2.npz", input_ids=good["input_ids"], attention_mask=good["attention_mask"] * 2)
    np.savez(tmp_path / "long.npz", input_ids=np.zeros((1, 600), np.int64), attention_mask=np.ones((1, 600), np.int64))
    (tmp_path / "text.npz").write_text("not an archive")
    ok = ["-i", tmp_path / "good.npz", "-o", tmp_path / "o.npz"]
    return [
        (["minilm", "-i", tmp_path / "missing.npz", "-o", tmp_path / "o.npz"],
         "missing.npz: not a readable .npz file of arrays (no such file)"),
        (["minilm", "-i", tmp_path / "wrongkeys.npz", "-o", tmp_path / "o.npz"], "found ['ids', 'mask']"),
        (["minilm", "-i", tmp_path / "nomask.npz", "-o", tmp_path / "o.npz"], "no array for input 'attention_mask'"),
        (["minilm", "-i", tmp_path / "float.npz", "-o", tmp_path / "o.npz"],
         "input 'input_ids' is float32, the graph needs i64"),
        (["minilm", "-i", tmp_path / "shape.npz", "-o", tmp_path / "o.npz"],
         "input 'attention_mask' has shape [1, 4], the graph needs [1, 6]"),
        (["minilm", "-i", tmp_path / "vocab.npz", "-o", tmp_path / "o.npz"],
         "input 'input_ids' must lie in 0..30521 (the vocabulary)"),
        (["minilm", "-i", tmp_path / "mask2.npz", "-o", tmp_path / "o.npz"], "only 0 and 1"),
        (["minilm", "-i", tmp_path / "long.npz", "-o", tmp_path / "o.npz"], "seq 600 must be in 1..512"),
        (["minilm", "-i", tmp_path / "text.npz", "-o", tmp_path / "o.npz"],
         "not a readable .npz file of arrays (not a zip archive"),
        (["no-such-model", *ok], "unknown model 'no-such-model': not a preset"),
        (["minilm", "-i", tmp_path / "good.npz", "-o", tmp_path / "nodir" / "o.npz"], "does not exist"),
        ([tmp_path, *ok], "no config.json"),  # a folder that is not a checkpoint
        (["llama-block", *ok], "unknown input(s) attention_mask, input_ids; the graph takes hidden_states"),
        (["minilm", "-i", tmp_path / "good.npz", "-o", f"{tmp_path}/"],
         f"output path {tmp_path}/ is a directory; give a .npz file name"),
        (["minilm", "-i", tmp_path / "good.npz", "-o", tmp_path],
         f"output path {tmp_path} is a directory; give a .npz file name"),
        (["/nonexistent/ckpt", *ok], "/nonexistent/ckpt: no such file or folder"),
        ([tmp_path / "text.npz", *ok], "run takes a preset name or a checkpoint folder, not a file"),
    ]


def test_bad_inputs_in_process(tmp_path, capsys):
    for args, fragment in _bad_cases(tmp_path):
        assert cli.main(["run", *map(str, args)]) == 2, args
        one_line_error(capsys.readouterr().err, fragment)
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("which", [0, 1, 9, 11])
def test_bad_inputs_subprocess(tmp_path, which):
    args, fragment = _bad_cases(tmp_path)[which]
    r = rlxviz("run", *args)
    assert r.returncode == 2 and r.stdout == ""
    one_line_error(r.stderr, fragment)


def test_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "minilm"])
    assert e.value.code == 2 and "--inputs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "minilm", "-i", "a.npz", "-o", "b.npz", "--backend", "cuda"])
    assert e.value.code == 2
    r = rlxviz("--version")
    assert r.returncode == 0 and r.stdout.startswith("rlxviz ")


def test_parser_is_extensible():
    names = {a.dest for a in cli.build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    assert {"model", "inputs", "output", "backend"} <= names
    calls = []

    @cli.subcommand
    def add_hello(sub):
        sub.add_parser("hello").set_defaults(func=lambda a: calls.append(a.command) or 0)

    try:
        assert cli.main(["hello"]) == 0 and calls == ["hello"]
    finally:
        cli.SUBCOMMANDS.remove(add_hello)


def test_mlx_backend_agrees_with_reference(tmp_path):
    ref = np.load(FIX / "minilm_reference.npz")
    np.savez(tmp_path / "in.npz", input_ids=ref["input_ids"][:2], attention_mask=ref["attention_mask"][:2])
    assert cli.main(["run", "minilm", "-q", "--backend", "mlx", "-i", str(tmp_path / "in.npz"),
                     "-o", str(tmp_path / "o.npz")]) == 0
    h = np.load(tmp_path / "o.npz")["last_hidden_state"]
    assert h.dtype == np.float32 and np.abs(h - ref["last_hidden_state"][:2]).max() <= 1e-4


def test_nan_weights_warn_on_stderr(tmp_path, capsys):
    ck = tiny_checkpoint(tmp_path / "ck", nan=["encoder.layer.0.output.dense.weight"])
    np.savez(tmp_path / "in.npz", **tokenize(["hi"], 4) | {"input_ids": np.array([[1, 2, 3, 4]])})
    assert cli.main(["run", str(ck), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    err = capsys.readouterr().err
    assert "rlxviz run: warning: the outputs hold NaN or infinite values" in err
    assert "'encoder.layer.0.output.dense.weight'" in err
    assert np.isnan(np.load(tmp_path / "o.npz")["last_hidden_state"]).all()
    good = tiny_checkpoint(tmp_path / "good")
    assert cli.main(["run", str(good), "-q", "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    assert capsys.readouterr().err == ""
