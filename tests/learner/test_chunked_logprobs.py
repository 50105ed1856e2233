"""The learner's log-probs a chunk of positions at a time (``learner.logit_chunk_size``): equal to the full
logits' log-softmax, with gradients to match, while the output embedding never sees more than one
chunk; mixed precision without float32 copies; models whose logits are not lm_head(decoder) refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from mia_engine.learner.batching import GRPOSample, prepare
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.grpo import chunked_token_logprobs, sequence_token_logprobs
from mia_engine.learner.learner import PlannerLearner

CHUNK = 7  # odd, and divides neither a sequence's scored positions nor a micro-batch's


def random_causal_lm(out: Path, family: str = "qwen3", *, targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"),
                     **config: object) -> tuple[Path, Path]:
    """A random 2-layer model of ``family`` saved as a Hugging Face folder, with a random-B PEFT LoRA."""
    import transformers
    from peft import LoraConfig, get_peft_model

    classes = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM")}
    config_cls, model_cls = (getattr(transformers, name) for name in classes[family])
    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, pad_token_id=0)
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**shape, **config}))
    model.save_pretrained(out / "base")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out / "adapter", save_embedding_layers=False)
    return out / "base", out / "adapter"


def samples(vocab_size: int, seed: int = 0) -> list[GRPOSample]:
    """Two groups of three, uneven prompt and completion lengths (padding, several prompt lengths)."""
    rng = random.Random(seed)
    out = []
    for g in range(2):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(3, 6))]
        for i in range(3):
            completion = [rng.randrange(vocab_size) for _ in range(rng.randint(9, 17))]
            out.append(GRPOSample(prompt_ids=prompt, completion_ids=completion, reward=float(i), group_id=f"q{g}"))
    return out


def full_logits_logprobs(learner: PlannerLearner, batch) -> torch.Tensor:
    """The computation the chunked one replaced: the model's (b, K, V) logits, then the log-softmax."""
    num_kept = batch.input_ids.shape[1] - batch.start
    logits = learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           logits_to_keep=num_kept, use_cache=False).logits  # (b, K, V)
    return sequence_token_logprobs(logits, batch.input_ids[:, batch.start:], learner.config.temperature)


def assert_exact(base: Path, adapter: Path, vocab_size: int, **config: object) -> None:
    """Chunked (CHUNK) log-probs and gradients equal the full-logits ones and the unchunked ones."""
    def learner(chunk: int) -> PlannerLearner:
        return PlannerLearner(base, adapter, LearnerConfig(logit_chunk_size=chunk, micro_batch_size=4,
                                                           temperature=0.7, **config))

    chunked, whole = learner(CHUNK), learner(10_000)
    batch = chunked._micro_batches(prepare(samples(vocab_size), 1e-6)[0])[0]
    assert batch.input_ids.shape[0] > 1 and (batch.input_ids.shape[1] - batch.start - 1) % CHUNK
    with torch.no_grad():
        torch.testing.assert_close(chunked._token_logprobs(batch), full_logits_logprobs(chunked, batch))
    grads, whole_grads = chunked.gradients(samples(vocab_size)), whole.gradients(samples(vocab_size))
    whole._token_logprobs = lambda b: full_logits_logprobs(whole, b)  # the previous code path
    old_grads = whole.gradients(samples(vocab_size))
    assert all(bool(g.abs().max() > 0) for g in grads.values()), "every LoRA weight gets a gradient"
    for key in grads:  # float32 sums in another order: within 1e-5 of the weight's largest gradient
        scale = float(old_grads[key].abs().max())
        torch.testing.assert_close(grads[key], whole_grads[key], rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(grads[key], old_grads[key], rtol=1e-4, atol=1e-5 * scale)


# ----- the fused linear + log-softmax on its own -----------------------------------------------------


@pytest.mark.parametrize("is_head_trainable", [False, True], ids=["frozen-head-fused", "trainable-head-checkpointed"])
@pytest.mark.parametrize("chunk", [1, CHUNK, 30, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_their_gradients_equal_the_full_log_softmax(chunk: int, is_head_trainable: bool,
                                                                          temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(30, 16, generator=gen, requires_grad=True)  # (N, H)
    head = torch.nn.Linear(16, 53, bias=False).requires_grad_(is_head_trainable)
    targets = torch.randint(0, 53, (30,), generator=gen)
    got = chunked_token_logprobs(hidden, targets, head, temperature, chunk)
    want = torch.log_softmax(head(hidden).float() / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    weights = torch.randn(30, generator=gen)
    inputs = [hidden, head.weight] if is_head_trainable else [hidden]
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    want_grads = torch.autograd.grad((want * weights).sum(), inputs)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


def test_fused_logprobs_keep_bf16_gradients_in_bf16() -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=gen).bfloat16().requires_grad_()
    head = torch.nn.Linear(16, 53, bias=False).bfloat16().requires_grad_(False)
    targets = torch.randint(0, 53, (12,), generator=gen)
    got = chunked_token_logprobs(hidden, targets, head, 0.7, 5)
    (grad,) = torch.autograd.grad(got.sum(), [hidden])
    want_logp = torch.log_softmax(head(hidden).float() / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    (want,) = torch.autograd.grad(want_logp.sum(), [hidden])
    assert got.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, want_logp)
    torch.testing.assert_close(grad, want, rtol=2e-2, atol=2e-2)


# ----- in the learner --------------------------------------------------------------------------------


def test_chunked_learner_matches_full_logits_on_the_tiny_model(tiny: Path) -> None:
    import json

    vocab_size = json.loads((tiny / "base" / "config.json").read_text())["vocab_size"]
    assert_exact(tiny / "base", tiny / "adapters" / "planner", vocab_size)


def test_chunked_learner_matches_full_logits_with_tied_embeddings(tmp_path: Path) -> None:
    base, adapter = random_causal_lm(tmp_path, tie_word_embeddings=True)
    learner = PlannerLearner(base, adapter, LearnerConfig(logit_chunk_size=CHUNK))
    assert learner.model.get_output_embeddings().weight is learner.model.get_input_embeddings().weight
    assert_exact(base, adapter, 97)


def test_a_lora_on_the_lm_head_still_trains_and_matches(tmp_path: Path) -> None:
    """The head is then not a frozen linear layer: each chunk is checkpointed and recomputed in the
    backward, still one chunk at a time, and autograd reaches the head's LoRA weights."""
    base, adapter = random_causal_lm(tmp_path, targets=("q_proj", "lm_head"), tie_word_embeddings=False)
    learner = PlannerLearner(base, adapter, LearnerConfig(logit_chunk_size=CHUNK, micro_batch_size=4))
    assert any(key.startswith("base_model.model.lm_head.lora_") for key in learner.lora_state())
    assert_exact(base, adapter, 97)
    seen: list[int] = []
    handle = learner.model.get_output_embeddings().register_forward_hook(
        lambda _m, _args, out: seen.append(out.numel() // out.shape[-1]))
    try:
        learner.gradients(samples(97))
    finally:
        handle.remove()
    batches = learner._micro_batches(prepare(samples(97), 1e-6)[0])
    scored = sum(b.input_ids.shape[0] * (b.input_ids.shape[1] - b.start - 1) for b in batches)
    assert max(seen) <= CHUNK and sum(seen) == 2 * scored  # the forward, and the backward's recompute


def test_the_output_embedding_never_sees_more_than_a_chunk(tiny: Path) -> None:
    """One chunk of positions per call, never the whole (b, K, V) logits; the frozen head's logits are
    made once per scored position (the backward needs no recompute)."""
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner",
                             LearnerConfig(logit_chunk_size=CHUNK, micro_batch_size=4, lr=1e-3))
    head = learner.model.get_output_embeddings()
    seen: list[int] = []  # positions per call
    handle = head.register_forward_hook(lambda _m, _args, out: seen.append(out.numel() // out.shape[-1]))
    try:
        result = learner.step(samples(2048))
    finally:
        handle.remove()
    assert result.is_accepted, result.reason
    batches = learner._micro_batches(prepare(samples(2048), 1e-6)[0])
    scored = sum(b.input_ids.shape[0] * (b.input_ids.shape[1] - b.start - 1) for b in batches)
    assert max(seen) <= CHUNK
    assert sum(seen) == scored


def test_bf16_step_casts_for_the_matmuls_instead_of_copying_activations_to_fp32(tiny: Path) -> None:
    """bfloat16 base weights: the step runs under autocast, the LoRA layers get bf16 inputs (PEFT would
    otherwise copy every projection's input to float32), the LoRA weights stay float32, and the
    gradient is the float32 learner's to bf16 accuracy."""
    bf16 = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(dtype="bfloat16"))
    fp32 = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig())
    assert bf16.model.config._attn_implementation == "sdpa"
    lora_inputs: list[torch.dtype] = []
    handles = [m.register_forward_hook(lambda _m, args, _out: lora_inputs.append(args[0].dtype))
               for name, m in bf16.model.named_modules() if name.endswith("lora_A.default")]
    try:
        grads = bf16.gradients(samples(2048))
    finally:
        for handle in handles:
            handle.remove()
    assert lora_inputs and set(lora_inputs) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.lora_state().values())
    want = fp32.gradients(samples(2048))
    got_flat = torch.cat([grads[k].flatten() for k in want])
    want_flat = torch.cat([want[k].flatten() for k in want])
    assert got_flat.dtype == torch.float32 and bool(torch.isfinite(got_flat).all())
    assert float(torch.nn.functional.cosine_similarity(got_flat, want_flat, dim=0)) > 0.99
    assert bf16.step(samples(2048)).is_accepted


def test_a_model_whose_logits_are_not_lm_head_of_the_decoder_is_refused(tmp_path: Path) -> None:
    """Gemma 2 soft-caps its logits after lm_head: chunked log-probs of lm_head(decoder) would be another
    policy's, so the learner refuses it at load, in one line."""
    base, adapter = random_causal_lm(tmp_path, "gemma2", final_logit_softcapping=0.5, query_pre_attn_scalar=8)
    with pytest.raises(ValueError, match=r"^Gemma2ForCausalLM: its logits are not lm_head\(decoder\(ids\)\)") as info:
        PlannerLearner(base, adapter, LearnerConfig())
    assert "\n" not in str(info.value)
