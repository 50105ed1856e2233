"""Embedded models: the tiny model is byte-identical everywhere; builds are atomic and cached."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from mia_engine.models.cache import build_once, tree_digest
from mia_engine.models.tiny import build_tiny

# The content hash of the tiny model build. It changes only when mia_engine/models/tiny.py (or
# lora.py) changes on purpose: then bump the folder suffix in models/embedded.py and update this.
TINY_SHA256 = "bbddb22fe280afe2d4b48d74d1b26827f1757116183bd186a5ea866e67c29441"


def test_tiny_build_is_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    build_tiny(first)
    build_tiny(second)
    assert tree_digest(first) == tree_digest(second)
    assert tree_digest(first) == TINY_SHA256


def test_tiny_model_loads_in_transformers_and_peft(tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny(tmp_path / "tiny")
    base_dir = tmp_path / "tiny" / "base"
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    ids = tokenizer("<think>plan</think>", return_tensors="pt").input_ids
    base_logits = model(ids).logits
    peft_model = PeftModel.from_pretrained(model, tmp_path / "tiny" / "adapters" / "planner")
    assert not torch.allclose(peft_model(ids).logits, base_logits)
    assert json.loads((tmp_path / "tiny" / "adapters" / "planner" / "adapter_config.json").read_text())["r"] == 8


def test_build_once_is_atomic_under_concurrency(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"
    calls: list[int] = []

    def build(out: Path) -> None:
        calls.append(1)
        (out / "weights").write_text("w")

    threads = [threading.Thread(target=build_once, args=(target, build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (target / "weights").read_text() == "w"
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no temp dirs left behind


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("killed mid-build")

    try:
        build_once(target, broken)
    except RuntimeError:
        pass
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_tiny_vl_build_is_deterministic_and_its_adapters_reach_the_language_model(tmp_path: Path) -> None:
    """Two builds are byte-identical; transformers loads the VL model, an image changes its logits, and the
    planner adapter's module names match the language model (PEFT changes the logits: vLLM reads the
    same names)."""
    import torch
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mia_engine.models.tiny_vl import build_tiny_vl

    first, second = tmp_path / "a", tmp_path / "b"
    build_tiny_vl(first)
    build_tiny_vl(second)
    assert tree_digest(first) == tree_digest(second)
    base_dir = first / "base"
    processor = AutoProcessor.from_pretrained(base_dir)
    model = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    text = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this"}]}],
        tokenize=False, add_generation_prompt=True)

    def logits(model, colour: tuple[int, int, int]) -> torch.Tensor:
        inputs = processor(text=[text], images=[[Image.new("RGB", (80, 60), colour)]], return_tensors="pt")
        return model(**inputs).logits[0, -1]

    red = logits(model, (220, 20, 20))
    assert not torch.allclose(red, logits(model, (20, 20, 220)))  # the image reaches the language model
    peft_model = PeftModel.from_pretrained(model, first / "adapters" / "planner")
    assert not torch.allclose(logits(peft_model, (220, 20, 20)), red)
