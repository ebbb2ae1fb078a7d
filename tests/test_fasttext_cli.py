"""The fastText-style command line (``python -m hsm supervised / test / predict``) and the
file methods of FastBowClassifier it runs: same numbers from both for the same seed and
settings, fastText's reading of its format and its output, one-line errors with exit status 2."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hsm import FastBowClassifier
from hsm.__main__ import main
from hsm.classifiers.fasttext_format import EOS, FastTextDictionary, fasttext_hash, read_lines

LABELS = ["baking", "bread", "sauce", "crème-brûlée", "eggs"]


def synthetic_lines(n: int, seed: int) -> list[str]:
    """fastText lines whose words depend on their labels: one or two labels per line, ASCII and
    non-ASCII words, tabs and repeated spaces (fastText splits on any ASCII whitespace)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        labels = rng.choice(len(LABELS), size=1 + int(rng.random() < 0.2), replace=False)
        words = [f"w{labels[0]}_{int(rng.integers(6))}" for _ in range(3)]
        words += [f"common{int(rng.integers(20))}" for _ in range(int(rng.integers(1, 4)))]
        words += ["Brûlée"] if 3 in labels else []
        rng.shuffle(words)
        lines.append(" ".join(f"__label__{LABELS[i]}" for i in labels) + "\t" + "  ".join(words))
    return lines


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fasttext")
    train, test = root / "train.txt", root / "test.txt"
    train.write_text("\n".join(synthetic_lines(400, 0) + ["an unlabelled line"]) + "\n", encoding="utf-8")
    test_lines = synthetic_lines(80, 1) + ["__label__unknown-tag w0_1 w0_2", "", "no label at all"]
    test.write_text("\n".join(test_lines), encoding="utf-8")  # no final newline: the last line still counts
    return {"root": root, "train": train, "test": test}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


SETTINGS = {  # -loss: (FastBowClassifier output, arity)
    "softmax": ("flat", 5),
    "hs": ("huffman", 2),
    "learned": ("learned", 3),
}


@pytest.mark.parametrize("loss, ngrams", [("softmax", 1), ("hs", 2), ("learned", 1)])
def test_command_line_and_python_api_agree(files, capsys, loss, ngrams):
    """supervised + test + predict give what fit_file + test_file + predict_file give, to the
    bit: same parameters, same printed N / P@k / R@k, same predicted labels and probabilities."""
    output, arity = SETTINGS[loss]
    prefix = files["root"] / f"model-{loss}"
    argv = ["supervised", "-input", files["train"], "-output", prefix, "-dim", 8, "-lr", 0.3, "-epoch", 3,
            "-wordNgrams", ngrams, "-bucket", 5000, "-thread", 1, "-loss", loss, "-seed", 7]
    if loss == "learned":
        argv += ["-arity", arity]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert out == "" and "Number of labels: 5" in err and Path(f"{prefix}.bin").is_file()

    api = FastBowClassifier(dim=8, output=output, arity=arity, lr=0.3, epochs=3, threads=1, seed=7, bias=False,
                            lr_schedule="linear")
    api.fit_file(files["train"], word_ngrams=ngrams, bucket=5000)
    saved = FastBowClassifier.load(f"{prefix}.bin")
    assert torch.equal(saved.model.embedding.weight, api.model.embedding.weight)
    for mine, theirs in zip(saved.layer.state_dict().values(), api.layer.state_dict().values()):
        assert torch.equal(mine, theirs)

    for k in (1, 2):
        code, out, _ = run(capsys, "test", f"{prefix}.bin", files["test"], k)
        assert code == 0
        result = api.test_file(files["test"], k)
        assert out == (f"N\t{result['examples']}\nP@{k}\t{result[f'precision_at_{k}']:.3g}\n"
                       f"R@{k}\t{result[f'recall_at_{k}']:.3g}\n")
        code, out, _ = run(capsys, "predict-prob", f"{prefix}.bin", files["test"], k)
        rows = api.predict_file(files["test"], k)
        assert out.splitlines() == [" ".join(f"{label} {p:.6g}" for label, p in row) for row in rows]
        code, out, _ = run(capsys, "predict", f"{prefix}.bin", files["test"], k)
        assert out.splitlines() == [" ".join(label for label, _ in row) for row in rows]


@pytest.mark.parametrize("loss", ["softmax", "learned"])
@pytest.mark.parametrize("flag, schedule", [(None, "linear"), ("linear", "linear"),
                                            ("constant-then-linear", "constant_then_linear")])
def test_lr_schedule_flag_reaches_the_classifier(files, capsys, loss, flag, schedule):
    """-lrSchedule is fastText's linear decay unless asked otherwise, for every loss (-loss
    learned included: the paper's constant-then-linear schedule only with the flag), and the
    classifier trains without a bias, as fastText's output matrix has none."""
    prefix = files["root"] / f"schedule-{loss}-{flag}"
    argv = ["supervised", "-input", files["train"], "-output", prefix, "-dim", 4, "-epoch", 1, "-thread", 1,
            "-loss", loss]
    if flag is not None:
        argv += ["-lrSchedule", flag]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    saved = FastBowClassifier.load(f"{prefix}.bin")
    assert saved.lr_schedule == schedule and saved.bias is False
    assert not [name for name in saved.layer.state_dict() if "bias" in name]


def test_lr_schedule_flag_is_in_the_help_and_checked(files, capsys):
    code, out, _ = run(capsys, "supervised", "-h")
    assert code == 0 and "-lrSchedule {linear,constant-then-linear}" in out and "the paper's" in out
    code, _, err = run(capsys, "supervised", "-input", files["train"], "-output", files["root"] / "x",
                       "-lrSchedule", "constant")
    assert code == 2 and "invalid choice: 'constant'" in err and len(err.strip().splitlines()) == 1


def test_fasttext_semantics_of_test_and_predict(files, capsys):
    """N counts the lines with a known label (fastText skips the others); predict prints one
    line per input line, labelled or not, empty ones included; k above K predicts all K labels
    (P@k over the predictions made); a threshold drops the unlikely labels."""
    prefix = files["root"] / "model-semantics"
    assert run(capsys, "supervised", "-input", files["train"], "-output", prefix, "-dim", 8, "-epoch", 2,
               "-thread", 1, "-verbose", 0)[:3] == (0, "", "")
    model = FastBowClassifier.load(f"{prefix}.bin")
    lines = read_lines(files["test"])
    assert len(lines) == 83 and lines[-2:] == ["", "no label at all"]
    result = model.test_file(files["test"])
    assert result["examples"] == 80  # not the unknown tag's line, nor the two without a label
    data = model.dictionary.encode(lines[:80])
    assert model.test(data.docs, data.labels) == result  # FastBowClassifier.test on the same rows
    code, out, _ = run(capsys, "predict", f"{prefix}.bin", files["test"])
    assert code == 0 and len(out.splitlines()) == 83
    all_k = model.test_file(files["test"], 7)  # K = 5: every label of the 80 lines is predicted
    assert all_k["recall_at_7"] == 1.0 and all_k["precision_at_7"] == data.label_values.size / (80 * 5)
    assert set(all_k) == {"examples", "precision_at_7", "recall_at_7"}
    rows = model.predict_file(files["test"], 5, threshold=0.2)
    assert all(p >= 0.2 for row in rows for _, p in row) and any(len(row) < 5 for row in rows)
    code, out, _ = run(capsys, "test", f"{prefix}.bin", files["test"], 5, 0.2)
    thresholded = model.test_file(files["test"], 5, 0.2)
    assert out.splitlines()[1] == f"P@5\t{thresholded['precision_at_5']:.3g}"
    assert thresholded["precision_at_5"] > all_k["precision_at_7"]


def test_standard_input(files, capsys, monkeypatch):
    import io
    import sys

    prefix = files["root"] / "model-stdin"
    run(capsys, "supervised", "-input", files["train"], "-output", prefix, "-dim", 4, "-epoch", 1, "-thread", 1)
    expected = run(capsys, "test", f"{prefix}.bin", files["test"])[1]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(files["test"].read_bytes())))
    assert run(capsys, "test", f"{prefix}.bin", "-")[1] == expected


def test_dictionary_reads_the_format_as_fasttext():
    lines = ["__label__a  x\ty\r", "__label__b __label__a x", "unlabelled x z", ""]
    d = FastTextDictionary.build(lines, min_count=2)
    assert d.words == [EOS, "x"]  # most frequent first; y, z seen once; "\r" is whitespace
    assert d.labels == ["__label__a", "__label__b"] and d.label_counts.tolist() == [2, 1]
    encoded = d.encode(lines)
    assert encoded.offsets.tolist() == [0, 2, 4, 6, 7]
    assert encoded.label_offsets.tolist() == [0, 1, 3, 3, 3] and encoded.labelled.tolist() == [0, 1]
    # fastText's hash is 32-bit FNV-1a (its test vectors for ASCII), over bytes read as signed
    # chars (test_fasttext_reads_the_same_dictionary_and_hashes checks non-ASCII against fastText)
    assert fasttext_hash("") == 0x811C9DC5 and fasttext_hash("a") == 0xE40C292C
    with pytest.raises(ValueError, match="no line has a label"):
        FastTextDictionary.build(["just words"])
    with pytest.raises(ValueError, match="at least 2"):
        FastTextDictionary.build(["__label__a words"])


def test_fasttext_reads_the_same_dictionary_and_hashes(files):
    """Checked against fastText itself: its words and label counts, and its hash (the ids of its
    character n-grams are hash % bucket, the hash word n-grams use)."""
    fasttext = pytest.importorskip("fasttext")
    model = fasttext.train_supervised(input=str(files["train"]), dim=4, epoch=1, minCount=2, thread=1, minn=2,
                                      maxn=3, bucket=1000, verbose=0)
    ours = FastTextDictionary.build(read_lines(files["train"]), min_count=2)
    assert sorted(model.words) == sorted(ours.words)
    labels, counts = model.get_labels(include_freq=True)
    assert dict(zip(labels, counts.tolist())) == dict(zip(ours.labels, ours.label_counts.tolist()))
    words = len(model.words)
    for word in ("Brûlée", "common3", "crème"):
        subwords, ids = model.get_subwords(word)
        pairs = [(s, i) for s, i in zip(subwords, ids) if s != word]
        assert pairs and all(i - words == fasttext_hash(s) % 1000 for s, i in pairs)


def test_word_ngrams_are_fasttexts(files):
    """With -wordNgrams 3 a line is its words, </s> and fastText's n-gram buckets: the mean of
    fastText's input rows at our ids is fastText's own sentence vector."""
    fasttext = pytest.importorskip("fasttext")
    from hsm.classifiers.fasttext_format import _tokens

    model = fasttext.train_supervised(input=str(files["train"]), dim=4, epoch=1, wordNgrams=3, bucket=1000,
                                      thread=1, verbose=0)
    ours = FastTextDictionary.build(read_lines(files["train"]), word_ngrams=3, bucket=1000)
    matrix, words = model.get_input_matrix(), len(model.words)
    for line in read_lines(files["test"])[:30] + ["unknown words here"]:
        tokens = _tokens(line)
        text = " ".join(t for t in tokens if not t.startswith("__label__"))
        ids = [model.get_word_id(t) for t in text.split() if model.get_word_id(t) >= 0]
        ids += [model.get_word_id(EOS)] + [words + b for b in ours._line_buckets(tokens)]
        np.testing.assert_allclose(matrix[ids].mean(0), model.get_sentence_vector(text), atol=1e-6)


def test_cooking_slice(capsys, tmp_path):
    """The cooking questions (fastText's tutorial data), a slice: CLI and API agree."""
    mirror = os.environ.get("HSM_DATA_MIRROR")
    archive = Path(mirror or "", "cooking", "cooking.stackexchange.tar.gz")
    if not mirror or not archive.is_file():
        pytest.skip("the cooking data are not in a local mirror (HSM_DATA_MIRROR)")
    from hsm_lab.data.fetch import read_tar_member

    lines = read_tar_member(archive, "cooking.stackexchange.txt").decode("utf-8").split("\n")
    train, test = tmp_path / "cooking.train", tmp_path / "cooking.valid"
    train.write_text("\n".join(lines[:3000]) + "\n", encoding="utf-8")
    test.write_text("\n".join(lines[-1000:]) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "supervised", "-input", train, "-output", tmp_path / "m", "-dim", 20, "-lr", 0.5,
                       "-epoch", 3, "-loss", "learned", "-arity", 5, "-thread", 1)
    assert code == 0 and "Number of labels:" in err
    code, out, _ = run(capsys, "test", tmp_path / "m.bin", test, 5)
    api = FastBowClassifier(dim=20, output="learned", arity=5, lr=0.5, epochs=3, threads=1, bias=False,
                            lr_schedule="linear").fit_file(train)
    result = api.test_file(test, 5)
    assert re.fullmatch(r"N\t\d+\nP@5\t[0-9.e-]+\nR@5\t[0-9.e-]+\n", out)
    assert out.splitlines() == [f"N\t{result['examples']}", f"P@5\t{result['precision_at_5']:.3g}",
                                f"R@5\t{result['recall_at_5']:.3g}"]


@pytest.mark.parametrize("argv, message", [
    (["supervised", "-input", "{train}"], "required: -output"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-lr", "0"], "lr must be"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-dim", "ten"], "-dim: invalid int"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-epochs", "3"], "unrecognized arguments"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-loss", "ova"], "invalid choice"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-loss", "hs", "-arity", "4"], "binary tree"),
    (["supervised", "-input", "{train}", "-output", "{root}/x", "-wordNgrams", "0"], "-wordNgrams must be"),
    (["supervised", "-input", "{root}/missing.txt", "-output", "{root}/x"], "no such file"),
    (["supervised", "-input", "{train}", "-output", "{root}/no/such/dir/x"], "does not exist"),
    (["test", "{root}/missing"], "expected a model"),
    (["test", "{root}/missing", "{test}"], "missing.bin"),
    (["test", "{test}", "{test}"], "not a model written by hsm"),
    (["predict", "{root}/model-semantics.bin", "{test}", "0"], "k must be >= 1"),
    (["predict", "{root}/model-semantics.bin", "{test}", "two"], "k must be a positive integer"),
    (["predict", "{root}/model-semantics.bin", "{test}", "1", "2"], "threshold must lie in"),
])
def test_bad_flags_and_values(files, capsys, argv, message):
    if not (files["root"] / "model-semantics.bin").is_file():
        run(capsys, "supervised", "-input", files["train"], "-output", files["root"] / "model-semantics",
            "-dim", 4, "-epoch", 1, "-thread", 1)
    argv = [a.format(train=files["train"], test=files["test"], root=files["root"]) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_refit_on_arrays_forgets_the_file_dictionary(files):
    classifier = FastBowClassifier(dim=4, epochs=1, threads=1, arity=2).fit_file(files["train"])
    assert classifier.predict_file(files["test"])
    classifier.fit([[0, 1], [2, 3]], [0, 1])
    with pytest.raises(RuntimeError, match="call fit_file again"):
        classifier.predict_file(files["test"])
    with pytest.raises(RuntimeError, match="not trained on a file"):
        FastBowClassifier(dim=4, epochs=1, threads=1, arity=2).fit([[0, 1], [2, 3]], [0, 1]).test_file(files["test"])


# ============================================================================ faults and bad input
def _train(capsys, train: Path, prefix: Path, *extra) -> tuple[int, str]:
    code, _, err = run(capsys, "supervised", "-input", train, "-output", prefix, "-dim", 4, "-epoch", 1,
                       "-thread", 1, "-verbose", 0, *extra)
    return code, err


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture()
def no_training(monkeypatch):
    """Makes any training an error: the checks under test must come before it."""
    def fail(*args, **kwargs):
        raise AssertionError("training started before the bad input was reported")

    monkeypatch.setattr(FastBowClassifier, "fit_file", fail)


def test_output_onto_a_folder_is_refused_before_training(files, capsys, tmp_path, no_training):
    (tmp_path / "m.bin").mkdir()
    code, err = _train(capsys, files["train"], tmp_path / "m")
    assert code == 2 and "is a folder" in _one_line(err)
    assert (tmp_path / "m.bin").is_dir()


def test_output_in_an_unwritable_folder_is_refused_before_training(files, capsys, tmp_path, monkeypatch, no_training):
    """A folder that refuses a new file (permissions, a read-only file system): one line before
    training. The refusal is simulated where it cannot be produced (as root, every folder is writable)."""
    import tempfile

    from hsm.classifiers import fasttext_cli

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fasttext_cli.tempfile, "NamedTemporaryFile", refuse)
    code, err = _train(capsys, files["train"], tmp_path / "m")
    assert code == 2 and "cannot write in" in _one_line(err) and "Permission denied" in err
    monkeypatch.setattr(fasttext_cli.tempfile, "NamedTemporaryFile", tempfile.NamedTemporaryFile)
    if os.geteuid() != 0:  # the real thing, where permissions apply
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        try:
            code, err = _train(capsys, files["train"], folder / "m")
            assert code == 2 and "cannot write in" in _one_line(err)
        finally:
            folder.chmod(0o755)


def _disk_full_on_save(monkeypatch) -> None:
    """torch.save writes 64 KiB and then finds the disk full (what a full disk did to m.bin)."""
    import errno

    def full(obj, handle, *args, **kwargs):
        handle.write(b"\0" * 65536)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)


def test_a_full_disk_leaves_the_previous_model_file_intact(files, capsys, tmp_path, monkeypatch):
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix)[0] == 0
    good = (tmp_path / "m.bin").read_bytes()
    expected = run(capsys, "test", tmp_path / "m.bin", files["test"])[1]
    _disk_full_on_save(monkeypatch)
    code, err = _train(capsys, files["train"], prefix, "-seed", 5)
    assert code == 1 and "the disk is full" in _one_line(err) and "unchanged" in err
    with pytest.raises(OSError, match="disk is full"):  # the Python API: the same file, the same rule
        FastBowClassifier.load(tmp_path / "m.bin").save(tmp_path / "m.bin")
    monkeypatch.undo()
    assert (tmp_path / "m.bin").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]  # no temporary left behind
    assert run(capsys, "test", tmp_path / "m.bin", files["test"])[1] == expected


def test_concurrent_saves_to_one_file_leave_a_readable_model(files, tmp_path):
    """Two writers of the same file: the reader gets one whole model, never a mix."""
    import threading

    models = [FastBowClassifier(dim=4, output="flat", epochs=1, threads=1, seed=s).fit_file(files["train"])
              for s in (0, 1)]
    target = tmp_path / "m.bin"

    def write(model):
        for _ in range(5):
            model.save(target)

    threads = [threading.Thread(target=write, args=(m,)) for m in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = FastBowClassifier.load(target).model.embedding.weight
    assert any(torch.equal(loaded, m.model.embedding.weight) for m in models)
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]


def test_a_repeated_gold_label_counts_once_on_both_paths(capsys, tmp_path):
    """A line's labels are a set: '__label__a __label__a' is one gold label, for test_file, the
    command line and FastBowClassifier.test alike (R@1 1.0, not 0.5)."""
    train = tmp_path / "train.txt"
    train.write_text("".join(f"__label__a __label__a apple pie {i % 3}\n__label__b bread loaf {i % 3}\n"
                             for i in range(40)), encoding="utf-8")
    model = FastBowClassifier(dim=8, output="flat", lr=0.5, epochs=5, threads=1).fit_file(train)
    model.save(tmp_path / "m.bin")
    result = model.test_file(train)
    assert result == {"examples": 80, "precision_at_1": 1.0, "recall_at_1": 1.0}
    data = model.dictionary.encode(read_lines(train))
    assert model.test(data.docs, data.labels) == result
    code, out, _ = run(capsys, "test", tmp_path / "m.bin", train)
    assert code == 0 and out == "N\t80\nP@1\t1\nR@1\t1\n"
    code, out, _ = run(capsys, "test", "-h")
    assert "counts once" in out


def test_a_byte_order_mark_is_not_part_of_the_first_label(capsys, tmp_path):
    lines = synthetic_lines(60, 2)
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_lines(marked) == read_lines(plain) == lines
    dictionary = FastTextDictionary.build(read_lines(marked))
    assert all(not label.startswith("\ufeff") for label in dictionary.labels + dictionary.words)
    model = FastBowClassifier(dim=4, output="flat", epochs=2, threads=1).fit_file(marked)
    reference = FastBowClassifier(dim=4, output="flat", epochs=2, threads=1).fit_file(plain)
    assert torch.equal(model.model.embedding.weight, reference.model.embedding.weight)
    assert model.test_file(marked) == model.test_file(plain)  # the first line counts, with its label
    model.save(tmp_path / "m.bin")
    assert run(capsys, "predict", tmp_path / "m.bin", marked)[1] == run(capsys, "predict", tmp_path / "m.bin", plain)[1]


def test_predict_writes_undecodable_labels_back_on_a_strict_utf8_stdout(tmp_path):
    """Labels that are not valid UTF-8 (a Latin-1 file) print as the bytes the file had, even
    where standard output is strict UTF-8 (no UnicodeEncodeError)."""
    import subprocess
    import sys

    train = tmp_path / "latin1.txt"
    train.write_bytes(b"".join(b"__label__caf\xe9 coffee cup %d\n__label__th\xe9 tea pot %d\n" % (i % 4, i % 4)
                               for i in range(30)))
    FastBowClassifier(dim=8, output="flat", lr=0.5, epochs=5, threads=1).fit_file(train).save(tmp_path / "m.bin")
    environment = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "HSM_THREADS": "1"}
    for command in ("predict", "predict-prob"):
        done = subprocess.run([sys.executable, "-m", "hsm", command, str(tmp_path / "m.bin"), str(train), "2"],
                              capture_output=True, env=environment, timeout=300)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 60 and lines[0].split()[0] == b"__label__caf\xe9"
        assert {b"__label__caf\xe9", b"__label__th\xe9"} <= set(lines[1].split())


def _damage(path: Path, change) -> Path:
    state = torch.load(path, weights_only=True)
    change(state)
    damaged = path.with_name(f"damaged-{abs(hash(repr(change))) % 10**6}.bin")
    torch.save(state, damaged)
    return damaged


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(version=2, hsm_version="9.9"), r"format version 2 \(written by hsm 9.9\) is not readable"),
    (lambda s: s["settings"].update(dim="wide"), r"damaged model file, .*dim"),
    (lambda s: s["settings"].update(colour=3), r"damaged model file, .*colour"),
    (lambda s: s.pop("layer"), r"damaged model file, .*no 'layer' entry"),
    (lambda s: s.update(num_words=3), r"damaged model file, .*embeddings"),
    (lambda s: s["settings"].update(arity=3), r"damaged model file, written by hsm"),
    (lambda s: s["dictionary"].update(labels=["__label__x"]), r"damaged model file, .*dictionary"),
    (lambda s: s["model"]["embedding.weight"].fill_(float("nan")), r"damaged model file, .*NaN"),
])
def test_a_model_of_another_version_or_damaged_is_one_line(files, capsys, tmp_path, change, message):
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix, "-loss", "huffman", "-arity", 2)[0] == 0
    damaged = _damage(tmp_path / "m.bin", change)
    from hsm.classifiers.fast_classifier import ModelFileError

    with pytest.raises(ModelFileError, match=message):
        FastBowClassifier.load(damaged)
    for command in ("test", "predict"):
        code, out, err = run(capsys, command, damaged, files["test"])
        line = _one_line(err)
        assert code == 2 and out == "" and re.search(message, line) and str(damaged) in line
        assert "retrain the model, or use the hsm version that wrote it" in line


@pytest.mark.parametrize("extra, message", [
    (["-minCount", "100000"], "-minCount 100000 leaves no word (the most frequent, </s>, occurs 401 times); "
                              "lower -minCount"),
    (["-seed", "-1"], "-seed must be >= 0, got -1"),
    (["-epoch", "0"], "-epoch must be >= 1, got 0"),
    (["-dim", "1000000000000"], "needs about"),
])
def test_setting_errors_name_the_option(files, capsys, tmp_path, extra, message):
    code, err = _train(capsys, files["train"], tmp_path / "m", *extra)
    assert code == 2 and message in _one_line(err)
    assert not (tmp_path / "m.bin").exists()


def test_setting_errors_name_the_setting_in_python():
    from hsm.classifiers.fast_classifier import SettingError

    with pytest.raises(SettingError, match="min_count 5 leaves no word .* lower min_count"):
        FastTextDictionary.build(["__label__a x", "__label__b y"], min_count=5)
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        FastBowClassifier(seed=-1)
    with pytest.raises(SettingError, match="lower dim") as caught:
        FastBowClassifier(dim=10**12, output="flat", epochs=1).fit([[0, 1], [1, 2]], [0, 1])
    assert caught.value.named("-dim").endswith("lower -dim, or check the number of words and labels")


def test_ctrl_c_stops_training_at_once_and_keeps_the_previous_model(files, capsys, tmp_path, monkeypatch):
    """A KeyboardInterrupt between two kernel steps ends supervised with one line and status 130,
    after that step (not at the end of the epoch), and m.bin is the previous model."""
    from hsm.classifiers import fast_trainer

    assert _train(capsys, files["train"], tmp_path / "m")[0] == 0
    good = (tmp_path / "m.bin").read_bytes()
    kernel, calls = fast_trainer._sgd_examples, []

    def interrupted_at_the_third_step(*args):
        calls.append(args[2].size)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return kernel(*args)

    monkeypatch.setattr(fast_trainer, "_sgd_examples", interrupted_at_the_third_step)
    monkeypatch.setattr(fast_trainer, "STEP_WORK", 1)  # one example a step: 400 steps an epoch
    code, out, err = run(capsys, "supervised", "-input", files["train"], "-output", tmp_path / "m", "-dim", 4,
                         "-epoch", 3, "-thread", 1, "-seed", 9)
    assert code == 130 and out == "" and "interrupted" in _one_line(err)
    assert len(calls) == 3 and calls == [1, 1, 1]
    assert (tmp_path / "m.bin").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]


# ---------------------------------------------------------------------------------------------- add-labels
def _new_label_lines(n: int, seed: int) -> list[str]:
    """Lines of a label the training file lacks: the words of two trained labels together."""
    rng = np.random.default_rng(seed)
    return [f"__label__soup w2_{int(rng.integers(6))} w4_{int(rng.integers(6))} w2_{int(rng.integers(6))} "
            f"w4_{int(rng.integers(6))}" for _ in range(n)]


def test_add_labels_writes_a_model_that_predicts_the_new_label(files, capsys, tmp_path):
    prefix = tmp_path / "model"
    code, err = _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3, "-epoch", 5, "-lr", 0.5,
                       "-dim", 8)
    assert code == 0, err
    new = tmp_path / "new.txt"
    new.write_text("\n".join(_new_label_lines(20, 0) + ["__label__baking w0_1 w0_2"]) + "\n", encoding="utf-8")
    held = tmp_path / "held.txt"
    held.write_text("\n".join(_new_label_lines(40, 1)) + "\n", encoding="utf-8")
    before = (prefix.parent / "model.bin").read_bytes()
    code, out, err = run(capsys, "add-labels", f"{prefix}.bin", new, "-output", tmp_path / "grown", "-reference",
                         files["train"])
    assert code == 0, err
    assert "Added 1 labels from 20 lines (1 lines with known labels only skipped); 6 labels now" in err
    assert (prefix.parent / "model.bin").read_bytes() == before  # the model given is not changed
    grown = FastBowClassifier.load(tmp_path / "grown.bin")
    assert grown.dictionary.labels[-1] == "__label__soup" and grown.num_labels == 6
    old = FastBowClassifier.load(f"{prefix}.bin")
    # the new label takes some of its own lines, and at most a few of the trained labels' (the slot
    # is calibrated to move at most 1 % of the reference lines)
    assert grown.test_file(held)["precision_at_1"] >= 0.2
    assert grown.test_file(files["test"])["precision_at_1"] >= old.test_file(files["test"])["precision_at_1"] - 0.05


@pytest.mark.parametrize("argv, message", [
    (("-output", "{tmp}/x"), "no line has a label the model does not know"),
    (("-output", "{tmp}/x", "-localSteps", "-1"), "-localSteps must be >= 0"),
    (("-output", "{tmp}/x", "-reference", "{tmp}/missing.txt"), "-reference {tmp}/missing.txt: no such file"),
    ((), "the following arguments are required: -output"),
])
def test_add_labels_bad_input_is_one_line(files, capsys, tmp_path, argv, message):
    prefix = tmp_path / "model"
    assert _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3)[0] == 0
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, _, err = run(capsys, "add-labels", f"{prefix}.bin", files["train"], *argv)
    assert code == 2 and message.format(tmp=tmp_path) in _one_line(err)


def test_add_labels_refuses_a_flat_model_and_warns_of_lines_it_cannot_read(files, capsys, tmp_path):
    flat = tmp_path / "flat"
    assert _train(capsys, files["train"], flat)[0] == 0
    new = tmp_path / "new.txt"
    new.write_text("\n".join(_new_label_lines(5, 0) + ["__label__other unseen words only"]) + "\n")
    code, _, err = run(capsys, "add-labels", f"{flat}.bin", new, "-output", tmp_path / "x")
    assert code == 2 and "output is flat" in _one_line(err)
    tree = tmp_path / "tree"
    assert _train(capsys, files["train"], tree, "-loss", "huffman", "-arity", 3)[0] == 0
    code, _, err = run(capsys, "add-labels", f"{tree}.bin", new, "-output", tmp_path / "x", "-reference",
                       files["train"], "-verbose", "0")
    assert code == 0 and "warning: 1 of the 6 lines hold no word the model knows" in _one_line(err)


def test_add_labels_never_replaces_the_model_it_was_given(files, capsys, tmp_path):
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3)[0] == 0
    before = (tmp_path / "m.bin").read_bytes()
    new = tmp_path / "new.txt"
    new.write_text("\n".join(_new_label_lines(5, 0)) + "\n")
    code, out, err = run(capsys, "add-labels", f"{prefix}.bin", new, "-output", prefix)
    assert code == 2 and out == "" and f"-output {prefix} would replace the model" in _one_line(err)
    assert (tmp_path / "m.bin").read_bytes() == before


@pytest.mark.parametrize("names, error, match", [
    (["two words"], ValueError, "holds whitespace or NUL"),
    (["line\nbreak"], ValueError, "holds whitespace or NUL"),
    (["tab\there"], ValueError, "holds whitespace or NUL"),
    (["__label__"], ValueError, "the prefix alone"),
    (["soup", "soup"], ValueError, "label __label__soup is given twice"),
    (["baking"], ValueError, "label __label__baking is already in the model"),
    ([3], TypeError, "label names must be strings"),
])
def test_add_labels_refuses_names_a_fasttext_file_cannot_hold(files, capsys, tmp_path, names, error, match):
    """A name with whitespace would be written into the model's dictionary and printed by predict
    as several tokens that never read back: refused in one line, the model unchanged."""
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3)[0] == 0
    clf = FastBowClassifier.load(f"{prefix}.bin")
    labels_before, k = list(clf.dictionary.labels), clf.num_labels
    docs = [[np.array([1, 2])] for _ in names]
    with pytest.raises(error, match=match):
        clf.add_labels(docs, names=names)
    assert clf.dictionary.labels == labels_before and clf.num_labels == k


def test_add_labels_refuses_a_negative_seed_before_reading_anything(files, capsys, tmp_path):
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3)[0] == 0
    code, _, err = run(capsys, "add-labels", f"{prefix}.bin", files["train"], "-output", tmp_path / "x", "-seed", -1)
    assert code == 2 and "-seed must be >= 0, got -1" in _one_line(err)


def test_add_labels_names_an_empty_reference_file_not_the_examples(files, capsys, tmp_path):
    prefix = tmp_path / "m"
    assert _train(capsys, files["train"], prefix, "-loss", "learned", "-arity", 3)[0] == 0
    new = tmp_path / "new.txt"
    new.write_text("\n".join(_new_label_lines(5, 0)) + "\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run(capsys, "add-labels", f"{prefix}.bin", new, "-output", tmp_path / "x", "-reference", empty)
    assert code == 2 and f"reference file {empty} holds no line" in _one_line(err) and "docs" not in err
    clf = FastBowClassifier.load(f"{prefix}.bin")
    with pytest.raises(ValueError, match="reference_docs is empty"):
        clf.add_labels([[np.array([1, 2])]], names=["soup"], reference_docs=[])
    assert clf.num_labels == len(LABELS)
