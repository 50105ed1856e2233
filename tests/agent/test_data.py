"""Dataset loaders: the paper's field layouts, answers as lists, images, and the real FanOutQA dev file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia_engine.base.data import Question, flatten_answers, load_dataset

DEVSET = Path(__file__).parents[2] / "bench" / "devset_wiki.jsonl"


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")
    return path


def test_jsonl_layouts(tmp_path):
    path = _write_jsonl(tmp_path / "set.jsonl", [
        {"id": "a", "question": " Capital of Peru? ", "answer": "Lima"},
        {"query": "Q2", "answers": ["x", "y"], "image": "img/1.png"},
        {"problem": "Q3", "golden_answers": [["nested"], 7], "data_id": 9, "image": {"bytes": b"".hex()}},
        {"question": "Q4", "gt": None},
        {"no_question": "skipped"},
        {"question": "Q5", "ground_truth": "['a', 'b']", "image": "https://example.invalid/x.png"},
    ])
    rows = load_dataset(str(path))
    assert rows[0] == Question("a", "Capital of Peru?", ["Lima"])
    assert rows[1].id == "1" and rows[1].answers == ["x", "y"] and rows[1].image == str(tmp_path / "img/1.png")
    assert rows[2].id == "9" and rows[2].answers == ["nested", "7"]
    assert rows[3].answers == []
    assert len(rows) == 5 and rows[4].image == "https://example.invalid/x.png"
    assert load_dataset(str(path), limit=2) == rows[:2]


def test_flatten_answers():
    assert flatten_answers({"Pat": "Right", "Mark": ["Left", {"x": 3}]}) == ["Right", "Left", "3"]
    assert flatten_answers('["a", "b"]') == ["a", "b"]
    assert flatten_answers(True) == ["True"] and flatten_answers("  ") == [] and flatten_answers(None) == []


def test_json_list_and_errors(tmp_path):
    path = tmp_path / "set.json"
    path.write_text(json.dumps([{"question": "q", "answer": 1}]))
    assert load_dataset(str(path)) == [Question("0", "q", ["1"])]
    with pytest.raises(FileNotFoundError, match="fanoutqa-dev"):
        load_dataset(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "set.csv"
    bad.write_text("question,answer\n")
    with pytest.raises(ValueError, match=".jsonl"):
        load_dataset(str(bad))


def test_parquet_needs_pyarrow_or_reads(tmp_path):
    path = tmp_path / "set.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(ImportError, match="pyarrow"):
            load_dataset(str(path))
        return
    pq.write_table(pa.table({"question": ["q"], "golden_answers": [["a", "b"]]}), path)
    assert load_dataset(str(path)) == [Question("0", "q", ["a", "b"])]


def test_real_fanoutqa_dev():
    rows = load_dataset("fanoutqa-dev")
    assert len(rows) == 310
    assert all(row.answers and all(isinstance(a, str) and a for a in row.answers) for row in rows)
    assert len({row.id for row in rows}) == 310


def test_devset_is_answerable_from_the_corpus():
    rows = load_dataset(str(DEVSET))
    assert len(rows) == 100 and len({row.id for row in rows}) == 100  # tests/test_devset.py checks the hops
    from mia_engine.tools.corpus import load_corpus

    by_title = {p.title: p.text for p in load_corpus("wiki-offline").passages}
    for line in DEVSET.read_text().splitlines():
        row = json.loads(line)
        assert row["answer"][0] in by_title[row["source_title"]]


def test_question_images_decode_from_files_and_bytes_and_refuse_urls(tmp_path):
    import io

    import pytest
    from PIL import Image

    from mia_engine.base.data import Question, question_image

    Image.new("L", (30, 20), 128).save(tmp_path / "q.png")
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (1, 2, 3)).save(buffer, format="JPEG")
    from_file = question_image(Question("a", "what?", [], str(tmp_path / "q.png")))
    from_bytes = question_image(Question("b", "what?", [], buffer.getvalue()))
    assert (from_file.mode, from_file.size, from_bytes.size) == ("RGB", (30, 20), (8, 6))
    assert question_image(Question("c", "what?", [])) is None
    with pytest.raises(ValueError, match="question d: .* is a URL"):
        question_image(Question("d", "what?", [], "https://example.com/x.png"))
    with pytest.raises(ValueError, match="question e: its image cannot be read"):
        question_image(Question("e", "what?", [], b"not an image"))
