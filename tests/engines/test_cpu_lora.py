"""The grouped CPU LoRA ops against vLLM's own PyTorch ops (the reference), small and large batches."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops import torch_ops

from mia_engine.engines import cpu_lora

SLOTS, RANK, HIDDEN, OUT = 4, 8, 64, 96


def _indices(num_tokens: int, seed: int, with_base: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = -1 if with_base else 0
    return torch.randint(low, SLOTS - 1, (num_tokens,), generator=g)  # last slot left empty, see below


def _weights(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    w[-1] = 0  # vLLM's ops read index -1 as the last slot: equal to "no adapter" only when it is empty
    return w


@pytest.mark.parametrize("num_tokens", [1, 7, cpu_lora.GATHER_MAX_TOKENS, 300])
@pytest.mark.parametrize("with_base", [False, True])
def test_shrink_and_expand_match_vllm(num_tokens: int, with_base: bool) -> None:
    idx = _indices(num_tokens, num_tokens, with_base)
    x = torch.randn(num_tokens, HIDDEN)
    a = _weights((SLOTS, 1, RANK, HIDDEN), 1)
    ours, ref = torch.zeros(num_tokens, RANK), torch.zeros(num_tokens, RANK)
    cpu_lora.bgmv_shrink(x, a, ours, idx, 0.5)
    torch_ops.bgmv_shrink(x, a, ref, idx, 0.5)
    torch.testing.assert_close(ours, ref)
    assert ours.abs().sum() > 0

    b = _weights((SLOTS, 1, OUT, RANK), 2)
    base = torch.randn(num_tokens, OUT + 8)
    for add in (True, False):
        ours, ref = base.clone(), base.clone()
        cpu_lora.bgmv_expand(x[:, :RANK], b, ours, idx, add)
        torch_ops.bgmv_expand(x[:, :RANK], b, ref, idx, add)
        torch.testing.assert_close(ours, ref)
        ours, ref = base.clone(), base.clone()
        cpu_lora.bgmv_expand_slice(x[:, :RANK], b, ours, idx, 4, OUT, add)
        torch_ops.bgmv_expand_slice(x[:, :RANK], b, ref, idx, 4, OUT, add)
        torch.testing.assert_close(ours, ref)


def test_a_batch_on_one_adapter_matches_vllm() -> None:
    idx = torch.full((300,), 2)
    x, a = torch.randn(300, HIDDEN), _weights((SLOTS, 1, RANK, HIDDEN), 5)
    ours, ref = torch.zeros(300, RANK), torch.zeros(300, RANK)
    cpu_lora.bgmv_shrink(x, a, ours, idx, 1.0)
    torch_ops.bgmv_shrink(x, a, ref, idx, 1.0)
    torch.testing.assert_close(ours, ref)


def test_sequence_variants_match_vllm() -> None:
    seq_lens = torch.tensor([5, 200, 1, 40])
    seq_idx = torch.tensor([0, -1, 2, 0])
    n = int(seq_lens.sum())
    starts = torch.cumsum(seq_lens, 0) - seq_lens
    meta = (starts, seq_lens, seq_idx, len(seq_lens), int(seq_lens.max()), n)
    x = torch.randn(n, HIDDEN)
    a = _weights((SLOTS, 1, RANK, HIDDEN), 3)
    b = _weights((SLOTS, 1, OUT, RANK), 4)
    ours, ref = torch.zeros(n, RANK), torch.zeros(n, RANK)
    cpu_lora.sgmv_shrink(x, a, ours, *meta, 2.0)
    torch_ops.sgmv_shrink(x, a, ref, *meta, 2.0)
    torch.testing.assert_close(ours, ref)
    ours, ref = torch.ones(n, OUT), torch.ones(n, OUT)
    cpu_lora.sgmv_expand(x[:, :RANK], b, ours, *meta, True)
    torch_ops.sgmv_expand(x[:, :RANK], b, ref, *meta, True)
    torch.testing.assert_close(ours, ref)
    ours, ref = torch.ones(n, OUT + 10), torch.ones(n, OUT + 10)
    cpu_lora.sgmv_expand_slice(x[:, :RANK], b, ours, *meta, 10, OUT, True)
    torch_ops.sgmv_expand_slice(x[:, :RANK], b, ref, *meta, 10, OUT, True)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("num_tokens", [5, cpu_lora.GATHER_MAX_TOKENS + 75])  # the gather path, the grouped path
def test_no_adapter_means_no_adapter_even_when_the_last_slot_is_loaded(num_tokens: int) -> None:
    """vLLM's ops give a base-model token (index -1) the last slot's adapter; ours give it nothing."""
    idx = torch.zeros(num_tokens, dtype=torch.long)
    idx[1::2] = -1  # base-model tokens between adapter-0 tokens, in both paths' batches
    x = torch.randn(num_tokens, HIDDEN)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN)  # every slot loaded
    out = torch.zeros(num_tokens, RANK)
    cpu_lora.bgmv_shrink(x, a, out, idx, 1.0)
    is_base = idx < 0
    assert torch.all(out[is_base] == 0)
    torch.testing.assert_close(out[~is_base], x[~is_base] @ a[0, 0].T)


def test_register_installs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    original = {name: getattr(punica_cpu, name) for name in cpu_lora.OPS}
    monkeypatch.delenv(cpu_lora.ENV, raising=False)
    cpu_lora.register()
    assert punica_cpu.bgmv_shrink is original["bgmv_shrink"]
    monkeypatch.setenv(cpu_lora.ENV, "grouped")
    for name, op in original.items():
        monkeypatch.setattr(punica_cpu, name, op)  # restored after the test
    cpu_lora.register()
    assert all(getattr(punica_cpu, name) is op for name, op in cpu_lora.OPS.items())


def test_register_refuses_a_vllm_without_the_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for and not installable (a vLLM that renamed its CPU ops): the engine fails to start, loudly,
    instead of serving with vLLM's ops and the "no adapter" bug behind a warning."""
    from vllm.lora.punica_wrapper import punica_cpu

    monkeypatch.setenv(cpu_lora.ENV, "grouped")
    monkeypatch.delattr(punica_cpu, "bgmv_expand_slice")  # restored after the test
    with pytest.raises(RuntimeError, match="cpu_lora_ops"):
        cpu_lora.register()
