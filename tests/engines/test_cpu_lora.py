"""The grouped CPU LoRA ops against vLLM's own PyTorch ops (the reference), small and large batches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.lora.ops import torch_ops

from mia_engine.engines.cpu import lora_ops
from mia_engine.engines.cpu.options import LORA_OPS_KEY

SLOTS, RANK, HIDDEN, OUT = 4, 8, 64, 96
SHRINK_GATHER_TOKENS = lora_ops.GATHER_MAX_ELEMENTS // (RANK * HIDDEN)
"""The most tokens a shrink here still gathers (an expand, OUT × RANK per token, switches sooner)."""


def _indices(num_tokens: int, seed: int, with_base: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = -1 if with_base else 0
    return torch.randint(low, SLOTS - 1, (num_tokens,), generator=g)  # last slot left empty, see below


def _weights(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    w[-1] = 0  # vLLM's ops read index -1 as the last slot: equal to "no adapter" only when it is empty
    return w


@pytest.mark.parametrize("num_tokens", [1, 7, SHRINK_GATHER_TOKENS, SHRINK_GATHER_TOKENS + 100])  # both paths of both
@pytest.mark.parametrize("with_base", [False, True])
def test_shrink_and_expand_match_vllm(num_tokens: int, with_base: bool) -> None:
    idx = _indices(num_tokens, num_tokens, with_base)
    x = torch.randn(num_tokens, HIDDEN)
    a = _weights((SLOTS, 1, RANK, HIDDEN), 1)
    ours, ref = torch.zeros(num_tokens, RANK), torch.zeros(num_tokens, RANK)
    lora_ops.bgmv_shrink(x, a, ours, idx, 0.5)
    torch_ops.bgmv_shrink(x, a, ref, idx, 0.5)
    torch.testing.assert_close(ours, ref)
    assert ours.abs().sum() > 0

    b = _weights((SLOTS, 1, OUT, RANK), 2)
    base = torch.randn(num_tokens, OUT + 8)
    for add in (True, False):
        ours, ref = base.clone(), base.clone()
        lora_ops.bgmv_expand(x[:, :RANK], b, ours, idx, add)
        torch_ops.bgmv_expand(x[:, :RANK], b, ref, idx, add)
        torch.testing.assert_close(ours, ref)
        ours, ref = base.clone(), base.clone()
        lora_ops.bgmv_expand_slice(x[:, :RANK], b, ours, idx, 4, OUT, add)
        torch_ops.bgmv_expand_slice(x[:, :RANK], b, ref, idx, 4, OUT, add)
        torch.testing.assert_close(ours, ref)


def test_a_batch_on_one_adapter_matches_vllm() -> None:
    idx = torch.full((300,), 2)
    x, a = torch.randn(300, HIDDEN), _weights((SLOTS, 1, RANK, HIDDEN), 5)
    ours, ref = torch.zeros(300, RANK), torch.zeros(300, RANK)
    lora_ops.bgmv_shrink(x, a, ours, idx, 1.0)
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
    lora_ops.sgmv_shrink(x, a, ours, *meta, 2.0)
    torch_ops.sgmv_shrink(x, a, ref, *meta, 2.0)
    torch.testing.assert_close(ours, ref)
    ours, ref = torch.ones(n, OUT), torch.ones(n, OUT)
    lora_ops.sgmv_expand(x[:, :RANK], b, ours, *meta, True)
    torch_ops.sgmv_expand(x[:, :RANK], b, ref, *meta, True)
    torch.testing.assert_close(ours, ref)
    ours, ref = torch.ones(n, OUT + 10), torch.ones(n, OUT + 10)
    lora_ops.sgmv_expand_slice(x[:, :RANK], b, ours, *meta, 10, OUT, True)
    torch_ops.sgmv_expand_slice(x[:, :RANK], b, ref, *meta, 10, OUT, True)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("num_tokens", [5, SHRINK_GATHER_TOKENS + 75])  # the gather path, the grouped path
def test_no_adapter_means_no_adapter_even_when_the_last_slot_is_loaded(num_tokens: int) -> None:
    """vLLM's ops give a base-model token (index -1) the last slot's adapter; ours give it nothing."""
    idx = torch.zeros(num_tokens, dtype=torch.long)
    idx[1::2] = -1  # base-model tokens between adapter-0 tokens, in both paths' batches
    x = torch.randn(num_tokens, HIDDEN)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN)  # every slot loaded
    out = torch.zeros(num_tokens, RANK)
    lora_ops.bgmv_shrink(x, a, out, idx, 1.0)
    is_base = idx < 0
    assert torch.all(out[is_base] == 0)
    torch.testing.assert_close(out[~is_base], x[~is_base] @ a[0, 0].T)


def _decode_shrink(wrapper_class: type, indices: torch.Tensor, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """One decode-step shrink through a Punica wrapper, with ``indices`` as its tokens' adapters."""
    wrapper = wrapper_class(max_num_batched_tokens=64, max_batches=8, device="cpu")
    wrapper._token_lora_indices[: len(indices)] = indices
    wrapper.indices_len[0] = len(indices)
    out = torch.zeros(len(indices), RANK)
    wrapper._shrink_decode(out, x, a, 1.0)
    return out


def test_the_grouped_wrapper_is_vllms_code_on_our_ops() -> None:
    """vLLM's CPU wrapper gives a "no adapter" token the last slot; the grouped one, the same vLLM code
    on our ops, gives it nothing; vLLM's own module is left as it was."""
    from vllm.lora.punica_wrapper import punica_cpu

    from mia_engine.engines.cpu.punica import GroupedPunicaWrapperCPU

    indices = torch.tensor([0, -1, 0, -1, 1])
    x = torch.randn(len(indices), HIDDEN, generator=torch.Generator().manual_seed(3))
    a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=torch.Generator().manual_seed(4))  # last slot loaded
    ours = _decode_shrink(GroupedPunicaWrapperCPU, indices, x, a)
    theirs = _decode_shrink(punica_cpu.PunicaWrapperCPU, indices, x, a)
    assert torch.all(ours[indices < 0] == 0) and not torch.all(theirs[indices < 0] == 0)
    torch.testing.assert_close(ours[indices >= 0], theirs[indices >= 0])
    assert GroupedPunicaWrapperCPU._shrink_decode.__code__ is punica_cpu.PunicaWrapperCPU._shrink_decode.__code__
    assert punica_cpu.bgmv_shrink is torch_ops.bgmv_shrink


def _linear_through(wrapper_class: type, ids: list[int], is_prefill: bool, x: torch.Tensor,
                    a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], slices: tuple[int, ...]) -> torch.Tensor:
    """One LoRA linear layer's ``add_lora_linear`` through a wrapper whose step maps the tokens to LoRA
    ids ``ids`` (0: none), slots loaded as vLLM's model manager does (``lora_index_to_id``)."""
    from vllm.lora.layers import LoRAMapping

    wrapper = wrapper_class(max_num_batched_tokens=2048, max_batches=64, device="cpu")
    wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=is_prefill), [11, 12, 13, None], SLOTS, 1000)
    y = torch.randn(len(ids), sum(slices), generator=torch.Generator().manual_seed(9))
    wrapper.add_lora_linear(y, x, a, b, 0.5, slices)
    return y


@pytest.mark.parametrize("num_tokens", [1, 7, 300, 1600])
@pytest.mark.parametrize("is_prefill", [False, True])
@pytest.mark.parametrize("mix", ["mixed", "one adapter", "none"])
def test_a_layer_with_every_slice_at_once_matches_vllms_wrapper(num_tokens: int, is_prefill: bool, mix: str) -> None:
    """The grouped wrapper's ``add_lora_linear`` (every q/k/v slice in one shrink and one expand per
    adapter, tokens grouped once per step) against vLLM's wrapper on vLLM's ops, bf16 as served."""
    from vllm.lora.punica_wrapper import punica_cpu

    from mia_engine.engines.cpu.punica import GroupedPunicaWrapperCPU

    choices = {"mixed": [0, 11, 12, 13], "one adapter": [12], "none": [0]}[mix]
    g = torch.Generator().manual_seed(num_tokens)
    ids = [choices[i] for i in torch.randint(0, len(choices), (num_tokens,), generator=g).tolist()]
    if is_prefill:
        ids.sort()  # a prefill step's tokens come a sequence at a time
    slices = (OUT, OUT // 2, OUT // 2)
    x = torch.randn(num_tokens, HIDDEN, generator=g).to(torch.bfloat16)
    a = tuple(_weights((SLOTS, 1, RANK, HIDDEN), 20 + i).to(torch.bfloat16) for i in range(3))
    b = tuple(_weights((SLOTS, 1, size, RANK), 30 + i).to(torch.bfloat16) for i, size in enumerate(slices))
    ours = _linear_through(GroupedPunicaWrapperCPU, ids, is_prefill, x, a, b, slices)
    theirs = _linear_through(punica_cpu.PunicaWrapperCPU, ids, is_prefill, x, a, b, slices)
    torch.testing.assert_close(ours, theirs)
    untouched = _linear_through(GroupedPunicaWrapperCPU, [0] * num_tokens, is_prefill, x, a, b, slices)
    assert torch.equal(ours, untouched) == (mix == "none")  # the adapters did change the layer's output


def test_a_slot_loaded_again_is_used_at_the_next_step() -> None:
    """The grouped wrapper keeps each layer's adapters stacked across steps; vLLM loading an adapter
    into a slot (an in-place write, as ``set_lora`` does) must reach the very next step, in the masked
    (small) and the per-adapter (large) step, with the expand in float32 or in bf16 (B kept in both),
    and an untouched layer keeps its stacked copy."""
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper import punica_cpu

    from mia_engine.engines.cpu.punica import GroupedPunicaWrapperCPU

    slices = (8 * OUT, 4 * OUT, 4 * OUT)  # wide enough for a bf16 expand at 1600 tokens
    a = tuple(_weights((SLOTS, 1, RANK, HIDDEN), 40 + i).to(torch.bfloat16) for i in range(3))
    b = tuple(_weights((SLOTS, 1, size, RANK), 50 + i).to(torch.bfloat16) for i, size in enumerate(slices))
    ours = GroupedPunicaWrapperCPU(max_num_batched_tokens=2048, max_batches=64, device="cpu")
    theirs = punica_cpu.PunicaWrapperCPU(max_num_batched_tokens=2048, max_batches=64, device="cpu")
    for num_tokens in (5, 600, 1600):  # masked; per adapter; per adapter with the expand in bf16
        ids = [[11, 12, 0][i % 3] for i in range(num_tokens)]
        x = torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(num_tokens)).to(torch.bfloat16)
        for step in range(3):
            if step == 1:  # a new adapter version loaded into slot 1 between two steps
                for w in a + b:
                    w[1, 0].copy_(torch.randn(w.shape[2:], generator=torch.Generator().manual_seed(60 + num_tokens)))
            outputs = []
            for wrapper in (ours, theirs):
                wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=False), [11, 12, None, None], SLOTS, 1000)
                y = torch.zeros(num_tokens, sum(slices), dtype=torch.bfloat16)
                wrapper.add_lora_linear(y, x, a, b, 1.0, slices)
                outputs.append(y)
            torch.testing.assert_close(*outputs)
        assert len(ours._layers) == 1


def test_embedding_and_logits_lora_are_skipped_only_while_no_slot_has_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM runs the embedding's and the LM head's LoRA every step even when no adapter targets them
    (all-zero weights). The grouped wrapper skips them then, with the same output as vLLM's wrapper
    bit for bit, and runs them again from the step after vLLM loads weights into a slot."""
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper import punica_cpu

    from mia_engine.engines.cpu.punica import GroupedPunicaWrapperCPU

    vocab, num_tokens = 300, 6
    ids = [11, 12, 0, 11, 13, 12]
    g = torch.Generator().manual_seed(70)
    x = torch.randn(num_tokens, HIDDEN, generator=g).to(torch.bfloat16)
    embedded_a = torch.randn(num_tokens, RANK, generator=g).to(torch.bfloat16)  # the layer's A rows, gathered
    head_a = torch.zeros(SLOTS, 1, RANK, HIDDEN, dtype=torch.bfloat16)
    head_b = torch.zeros(SLOTS, 1, vocab, RANK, dtype=torch.bfloat16)
    embedding_b = torch.zeros(SLOTS, 1, HIDDEN, RANK, dtype=torch.bfloat16)
    ours = GroupedPunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    theirs = punica_cpu.PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    ran: list[str] = []  # vLLM's code (on our ops) run by the grouped wrapper
    below = GroupedPunicaWrapperCPU.__mro__[1]  # what its super() calls
    for method in ("add_lora_logits", "add_lora_embedding"):
        original = getattr(below, method)
        monkeypatch.setattr(below, method,
                            lambda *a, _f=original, _m=method, **k: (ran.append(_m), _f(*a, **k))[1])
    before = {"logits": torch.randn(num_tokens, vocab, generator=g).to(torch.bfloat16),
              "embedding": torch.randn(num_tokens, HIDDEN, generator=g).to(torch.bfloat16)}

    def step() -> list[dict[str, torch.Tensor]]:
        outputs = []
        for wrapper in (ours, theirs):
            wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=False), [11, 12, 13, None], SLOTS, 1000)
            out = {name: y.clone() for name, y in before.items()}
            wrapper.add_lora_logits(out["logits"], x, head_a, head_b, 1.0)
            wrapper.add_lora_embedding(out["embedding"], embedded_a, embedding_b, add_inputs=True)
            outputs.append(out)
        return outputs

    for name, y in step()[0].items():  # no adapter targets them: nothing added, as in vLLM's wrapper
        assert torch.equal(y, before[name])
    assert ran == []
    with torch.no_grad():  # vLLM's set_lora: an in-place copy into slot 1
        head_a[1, 0].copy_(torch.randn(RANK, HIDDEN, generator=g))
        head_b[1, 0].copy_(torch.randn(vocab, RANK, generator=g))
        embedding_b[1, 0].copy_(torch.randn(HIDDEN, RANK, generator=g))
    mine, vllms = step()
    for name in before:
        torch.testing.assert_close(mine[name], vllms[name])
        assert not torch.equal(mine[name], before[name])
    assert ran == ["add_lora_logits", "add_lora_embedding"]
    head_b[1] = 0  # vLLM's reset_lora
    embedding_b[1] = 0
    for name, y in step()[0].items():
        assert torch.equal(y, before[name])
    assert len(ran) == 2


def test_a_wrapper_that_no_longer_calls_the_ops_is_refused() -> None:
    """A vLLM whose CPU wrapper renamed an op: grouped ops asked for fail the engine's start, by name."""
    from mia_engine.engines.cpu.punica import with_ops

    class Renamed:  # never called; what counts is which global names its methods load
        def shrink(self, x: torch.Tensor) -> None:
            torch_ops.bgmv_shrink_v2(x)

        def expand(self, x: torch.Tensor) -> None:
            torch_ops.bgmv_expand(x)  # an attribute of the module, not the global name: not ours to replace

    with pytest.raises(RuntimeError, match=r"cpu\.lora_ops") as refused:
        with_ops(Renamed, lora_ops.OPS, "Grouped")
    assert "'bgmv_shrink'" in str(refused.value) and "'bgmv_expand'" in str(refused.value)


@pytest.mark.parametrize(("choice", "wrapper"), [("grouped", "GroupedPunicaWrapperCPU"),
                                                 ("vllm", "PunicaWrapperCPU"), (None, "PunicaWrapperCPU")])
def test_each_engine_config_picks_its_wrapper(monkeypatch: pytest.MonkeyPatch, choice: str | None,
                                              wrapper: str) -> None:
    import vllm.config

    from mia_engine.engines.cpu.platform import MIACpuPlatform

    extra = {} if choice is None else {LORA_OPS_KEY: choice}
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: SimpleNamespace(additional_config=extra))
    assert MIACpuPlatform.get_punica_wrapper().rsplit(".", 1)[1] == wrapper


def test_the_platform_plugin_is_active_on_a_cpu_build_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.platforms

    from mia_engine.engines.platforms import platform_plugin

    assert platform_plugin() == "mia_engine.engines.cpu.platform.MIACpuPlatform"
    monkeypatch.setattr(vllm.platforms, "cpu_platform_plugin", lambda: None)  # a GPU build
    assert platform_plugin() is None


def test_the_served_engine_runs_the_grouped_wrapper(tiny_server) -> None:
    """End to end: the tiny config asks for grouped ops (the default), and vLLM's engine process, which
    resolves the platform and builds the wrapper itself, names the wrapper it built in the server log."""
    log = tiny_server.log_path.read_text(errors="replace")
    assert "Using GroupedPunicaWrapperCPU" in log and "Using PunicaWrapperCPU" not in log
