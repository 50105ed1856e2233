"""Evaluation and test-time-learning datasets as ``Question`` rows.

Reads the layouts of the paper's data (jsonl / parquet / a JSON list; question under ``question``,
``query`` or ``problem``; answers under ``answer``, ``answers``, ``golden_answers`` or ``gt``; an
optional image as a path or bytes) and the FanOutQA dev file by name (``fanoutqa-dev``), whose
answers may be a string, a list or a dict (its values, flattened, are the acceptable answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from .packages import FANOUTQA, DataPackage, package_dir

QUESTION_KEYS = ("question", "query", "problem")
ANSWER_KEYS = ("answer", "answers", "golden_answers", "gt", "ground_truth")
ID_KEYS = ("id", "ids", "data_id", "qid", "question_id")
IMAGE_KEYS = ("image", "image_path", "images", "img")
NAMED_DATASETS: dict[str, tuple[DataPackage, tuple[str, ...]]] = {
    "fanoutqa-dev": (FANOUTQA, ("data", "fanout-final-dev.json"))}
"""Datasets resolved from installed packages: name → (package, path inside it)."""


class Question(msgspec.Struct, frozen=True):
    """One benchmark question."""

    id: str
    question: str
    answers: list[str]
    """Acceptable answers (any one is correct); empty when the set has no ground truth."""
    image: str | bytes | None = None
    """Image file path or encoded bytes, for multimodal questions."""


def load_dataset(path_or_name: str, limit: int | None = None) -> list[Question]:
    """Rows of a .jsonl / .json / .parquet file, or of a named dataset (``fanoutqa-dev``)."""
    path = named_dataset_path(path_or_name) if path_or_name in NAMED_DATASETS else Path(path_or_name).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no such dataset file or name: {path_or_name!r} (names: {sorted(NAMED_DATASETS)})")
    questions = []
    for index, row in enumerate(read_rows(path)):
        question = row_question(row, index, base=path.parent)
        if question is not None:
            questions.append(question)
        if limit is not None and len(questions) >= limit:
            break
    return questions


def named_dataset_path(name: str) -> Path:
    package, parts = NAMED_DATASETS[name]
    return package_dir(package, f"dataset {name!r}").joinpath(*parts)


def read_rows(path: Path) -> Iterator[Any]:
    """Rows of a .jsonl (one object a line), .json (a list, or {\"data\": [...]}) or .parquet file."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
    elif path.suffix == ".jsonl":
        with path.open("rb") as lines:
            yield from (json.loads(line) for line in lines if line.strip())
    elif path.suffix == ".json":
        data = json.loads(path.read_bytes())
        yield from (data if isinstance(data, list) else data.get("data", []) if isinstance(data, dict) else [])
    else:
        raise ValueError(f"{path}: datasets are .jsonl, .json or .parquet files")


def _parquet_rows(path: Path) -> Iterator[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install 'mia-engine[parquet]'") from None
    for batch in pq.ParquetFile(path).iter_batches():
        yield from batch.to_pylist()


def row_question(row: Any, index: int, base: Path | None = None) -> Question | None:
    """A ``Question`` from one row in any supported layout; None for a row without a question."""
    if not isinstance(row, dict):
        return None
    text = _first(row, QUESTION_KEYS)
    if not isinstance(text, str) or not text.strip():
        return None
    identifier = _first(row, ID_KEYS)
    answers = flatten_answers(_first(row, ANSWER_KEYS))
    return Question(str(identifier) if identifier not in (None, "") else str(index), text.strip(), answers,
                    _image(_first(row, IMAGE_KEYS), base))


def _first(row: dict, keys: Iterable[str]) -> Any:
    return next((row[key] for key in keys if row.get(key) is not None), None)


def flatten_answers(value: Any) -> list[str]:
    """Acceptable answers as strings: a string, a list, a dict's values (FanOutQA), nested; no empties."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [a for item in value.values() for a in flatten_answers(item)]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in flatten_answers(item)]
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):  # a list stored as a JSON string (some parquet sets)
        try:
            return flatten_answers(json.loads(text))
        except ValueError:
            pass
    return [text] if text else []


def _image(value: Any, base: Path | None) -> str | bytes | None:
    """A path (relative ones resolved against the dataset's folder) or bytes; HF ``{"bytes", "path"}`` too."""
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and "://" in value:
        return value
    if isinstance(value, str) and value:
        path = Path(value).expanduser()
        return str(base / path) if base is not None and not path.is_absolute() else str(path)
    return None


def question_image(question: Question) -> Any:
    """The question's image decoded to RGB (a ``PIL.Image``), or None for a text question. A dataset's
    image is a local file or bytes; a URL is refused (nothing is downloaded)."""
    if question.image is None:
        return None
    import io

    from PIL import Image

    if isinstance(question.image, str) and "://" in question.image:
        raise ValueError(f"question {question.id}: image {question.image!r} is a URL; datasets need local images")
    source = io.BytesIO(question.image) if isinstance(question.image, bytes) else question.image
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except (OSError, ValueError) as err:
        raise ValueError(f"question {question.id}: its image cannot be read ({type(err).__name__})") from None
