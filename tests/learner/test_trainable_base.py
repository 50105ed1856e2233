"""The learner refuses a base it cannot train (quantised) before loading anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia_engine.learner.model import UntrainableBase, check_trainable_base


def base(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", **config}))
    return tmp_path


def test_a_quantised_checkpoint_is_refused(tmp_path: Path) -> None:
    folder = base(tmp_path, quantization_config={"quant_method": "awq", "bits": 4})
    with pytest.raises(UntrainableBase, match=r"a quantised base \(awq\) cannot be trained by the test-time learner"):
        check_trainable_base(folder)


def test_a_base_the_engine_quantises_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UntrainableBase, match=r"\(fp8\)"):
        check_trainable_base(base(tmp_path), quantization="fp8")


def test_a_full_precision_base_is_trained(tmp_path: Path) -> None:
    check_trainable_base(base(tmp_path, torch_dtype="bfloat16"))
    check_trainable_base(base(tmp_path), quantization=None)
