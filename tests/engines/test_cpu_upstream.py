"""The vLLM patches in ``mia_engine/engines/cpu/upstream/`` still apply to the installed vLLM, and the Punica
one, applied, lets the grouped wrapper set its ops as class attributes instead of rebinding vLLM's code."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import vllm

VLLM = Path(vllm.__file__).parent
UPSTREAM = Path(__file__).parents[2] / "mia_engine" / "engines" / "cpu" / "upstream"  # this checkout's
PATCHES = sorted(UPSTREAM.glob("*.patch"))

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch tool")


def _patched_tree(tmp_path: Path, patch: Path) -> Path:
    """The vLLM files ``patch`` changes, copied under ``tmp_path`` and patched there."""
    for line in patch.read_text().splitlines():
        if line.startswith("--- a/vllm/"):
            target = tmp_path / line.removeprefix("--- a/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(VLLM / line.removeprefix("--- a/vllm/"), target)
    done = subprocess.run(["patch", "-p1", "--forward", "-i", str(patch)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_the_patch_applies_to_the_installed_vllm(tmp_path: Path, patch: Path) -> None:
    _patched_tree(tmp_path, patch)


def test_with_the_punica_patch_the_rebinding_can_go(tmp_path: Path) -> None:
    """vLLM's wrapper, patched, with our ops set as class attributes: the same shrink as the wrapper we
    build by rebinding today (``punica._OnOurOps``), "no adapter" tokens included."""
    from mia_engine.engines.cpu.lora_ops import OPS
    from mia_engine.engines.cpu.punica import _OnOurOps

    tree = _patched_tree(tmp_path, UPSTREAM / "vllm-punica-cpu-ops.patch")
    spec = importlib.util.spec_from_file_location("vllm.lora.punica_wrapper._patched_punica_cpu",
                                                  tree / "vllm/lora/punica_wrapper/punica_cpu.py")
    patched = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patched)
    on_attributes = type("OnAttributes", (patched.PunicaWrapperCPU,),
                         {name: staticmethod(op) for name, op in OPS.items()})
    indices = torch.tensor([0, -1, 2, -1, 1])
    x = torch.randn(len(indices), 32, generator=torch.Generator().manual_seed(1))
    a = torch.randn(3, 1, 8, 32, generator=torch.Generator().manual_seed(2))  # every slot loaded
    outputs = []
    for wrapper_class in (on_attributes, _OnOurOps):
        wrapper = wrapper_class(max_num_batched_tokens=16, max_batches=4, device="cpu")
        wrapper._token_lora_indices[: len(indices)] = indices
        wrapper.indices_len[0] = len(indices)
        out = torch.zeros(len(indices), 8)
        wrapper._shrink_decode(out, x, a, 1.0)
        outputs.append(out)
    torch.testing.assert_close(*outputs)
    assert torch.all(outputs[0][indices < 0] == 0)
