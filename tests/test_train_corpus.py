"""The teacher-forced corpus: real text from this machine, in chat form, never a benchmark row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_dflash.generate import encode
from sglang_dflash.train.corpus import CORPUS_PREFIX, corpus_rows, documents
from sglang_dflash.train.data import FeatureSet, archive_responses, prepare_corpus

DATASETS = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


@pytest.fixture(scope="module")
def tokenizer():
    from sglang_dflash.targets import load_tokenizer, smollm2_hf_dir

    return load_tokenizer(smollm2_hf_dir())


def test_corpus_rows_are_chat_turns_of_bounded_length(tokenizer):
    rows = corpus_rows(tokenizer, 40, max_tokens=64, seed=3)
    assert len(rows) == 40
    assert rows == corpus_rows(tokenizer, 40, max_tokens=64, seed=3)  # reproducible
    for row in rows:
        assert row["prompt_ids"] == encode(tokenizer, row["prompt"], chat=True)
        assert 1 <= len(row["response_ids"]) <= 64 + 16
    assert len({row["prompt"] for row in rows}) > 10  # many documents, not one


def test_corpus_contains_no_benchmark_prompt():
    files = sorted(DATASETS.glob("*.jsonl"))
    assert len(files) == 5
    turns = [turn for f in files for line in f.read_text().splitlines() for turn in json.loads(line)["turns"]]
    # The opening of every benchmark turn long enough to be distinctive.
    openings = {" ".join(turn.split())[:80] for turn in turns if len(turn) >= 80}
    text = "\n".join(" ".join(body.split()) for _, body in documents())
    assert len(text) > 5_000_000  # the whole standard library was read
    assert not [opening for opening in openings if opening in text]


@pytest.mark.slow
def test_corpus_shards_resume_and_stay_out_of_the_answer_archive(tmp_path, checkpoints, tokenizer):
    from sglang_dflash.targets import TargetModel, smollm2_hf_dir

    target = TargetModel.from_pretrained(checkpoints.target("llama", tokenizer_from=smollm2_hf_dir()))
    rows = corpus_rows(tokenizer, 5, max_tokens=24)
    assert prepare_corpus(tmp_path, target, rows, [1, 2], shard_size=2) == 3
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "features").iterdir()}
    assert prepare_corpus(tmp_path, target, rows, [1, 2], shard_size=2) == 3
    assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "features").iterdir()}
    data = FeatureSet.load(tmp_path)
    assert len(data) == 5 and data.sources[0] == f"{CORPUS_PREFIX}00000"
    assert not any(data.is_generated_answer(i) for i in range(len(data)))
    assert archive_responses(tmp_path, tmp_path / "archive") == []
