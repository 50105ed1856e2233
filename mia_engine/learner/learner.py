"""The Planner's test-time learner: a PEFT copy of the Planner that takes GRPO steps on judged rollouts.

One ``step`` per batch (MIA algorithm 3, step 7): stale samples left out → group advantages → padded
micro-batches → token log-probs (``logit_chunk_size`` positions' logits at a time; a token sampled under
a regex scored under the grammar mask it was sampled with, ``grammar_mask``) → clipped surrogate loss
against the sampling engine's log-probs (the learner's own where none came) → accumulated gradients →
clipped AdamW step on the LoRA weights only. A step that would make the policy non-finite
is rejected and leaves the weights bit-identical, so one poisoned batch can never reach the serving
engine. ``save_adapter`` writes the weights in the PEFT layout vLLM loads.

Synchronous and not thread-safe: the server runs ``step`` in an executor, one call at a time.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..base.files import atomic_dir
from .batching import (GRPOSample, MicroBatch, PreparedSequence, check_samples, drop_long, drop_stale, micro_batches,
                       prepare)
from ..config.learner import LearnerConfig
from .grammar_mask import GrammarReplay
from .grpo import TokenMask, chunked_token_logprobs, grpo_loss
from .model import autocast, decoder_and_head, load_peft_model
from .recompute import Recompute
from .step_result import StepResult, StepSummary, StepTotals

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_LORA_PARAM = re.compile(r"\.(lora_[AB])\.default\.weight$")


class PlannerLearner:
    """The Planner's base model with its LoRA adapter, trainable, plus an AdamW over the LoRA weights."""

    def __init__(self, base_dir: Path, adapter_dir: Path, config: LearnerConfig = LearnerConfig(),
                 publish_dtype: torch.dtype | None = None) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.publish_dtype = publish_dtype
        """Dtype of published adapters (the serving engine's); None = the LoRA weights' own (fp32)."""
        self.device = torch.device(config.device)
        self.model = load_peft_model(Path(base_dir), Path(adapter_dir), config)
        self._decoder, self._head = decoder_and_head(self.model, config)
        self._adapter_config_text = (Path(adapter_dir) / ADAPTER_CONFIG).read_text()
        self._params = _lora_parameters(self.model)
        self._optimizer = self._new_optimizer()
        self._pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self._vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.recompute = Recompute(self._decoder, config, self._vocab_size,
                                   sum(p.numel() for p in self._params.values()))
        """Which layers gradient checkpointing recomputes, chosen before each micro-batch's forward."""
        self._grammar = GrammarReplay(Path(base_dir), self._vocab_size)
        self.version = 0

    # ----- public API -------------------------------------------------------------------------------

    def step(self, samples: list[GRPOSample], policy_version: int | None = None) -> StepResult:
        """One GRPO update from a batch of judged rollouts; rejected (weights untouched) if non-finite.
        ``policy_version``: the Planner adapter version serving now; samples more than
        ``max_sample_staleness`` versions older are left out (None: none are).

        Raises ValueError for malformed samples (misaligned masks or log-probs, unknown token ids)."""
        started = time.perf_counter()
        check_samples(samples, self._vocab_size)
        samples, num_stale = drop_stale(samples, policy_version, self.config.max_sample_staleness)
        if num_stale:
            log.warning("left %d stale rollouts out of the update: sampled more than %d versions before v%s",
                        num_stale, self.config.max_sample_staleness, policy_version)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)  # (N,)
        summary = StepSummary(rewards, started)
        summary.num_skipped_stale = num_stale
        if not samples:
            return summary.rejected("every rollout of the batch is stale", self.version)
        if not bool(torch.isfinite(rewards).all()):
            return summary.rejected("non-finite reward in the batch", self.version)
        sequences, num_skipped = prepare(samples, self.config.advantage_eps)
        sequences, summary.num_skipped_long = drop_long(sequences, self.config.max_seq_len)
        summary.num_skipped_groups, summary.num_sequences = num_skipped, len(sequences)
        if not sequences:
            return summary.rejected("no learning signal: every group's rewards are equal", self.version)
        return self._train(sequences, summary)

    def gradients(self, samples: list[GRPOSample]) -> dict[str, torch.Tensor]:
        """The full-batch loss gradient per LoRA weight (PEFT key names), without an update.

        For tests and diagnostics: it runs exactly the accumulation ``step`` runs."""
        check_samples(samples, self._vocab_size)
        sequences, _ = prepare(samples, self.config.advantage_eps)
        sequences, _ = drop_long(sequences, self.config.max_seq_len)
        self._optimizer.zero_grad(set_to_none=True)
        if sequences:
            normalizer = _normalizer(sequences, self.config.aggregation)
            self._accumulate(self._micro_batches(sequences), normalizer, first_epoch=True)
        grads = {key: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                 for key, p in self._params.items()}
        self._optimizer.zero_grad(set_to_none=True)
        return grads

    def token_logprobs(self, samples: list[GRPOSample]) -> list[torch.Tensor]:
        """Per sample, (C,) float32 log-probs of its completion tokens under the current weights, each token
        as the step scores it (under its grammar mask where it was sampled under one); no update.

        For diagnostics (the KL between consecutive versions on the same samples: bench/bench_lr_curve.py)."""
        check_samples(samples, self._vocab_size)
        out = []
        with torch.no_grad():
            for s in samples:  # one at a time: no padding to undo
                sequence = PreparedSequence(s.prompt_ids + s.completion_ids, len(s.prompt_ids),
                                            [1.0] * len(s.completion_ids), None, 0.0, list(s.grammar_spans))
                (batch,) = micro_batches([sequence], 1, self._pad_id, self.device)
                out.append(self._token_logprobs(batch)[0].float().cpu())  # start = P − 1: (C,)
        return out

    def save_adapter(self, out_dir: Path) -> Path:
        """Write the current LoRA weights as a PEFT folder, atomically (temp folder + rename).

        ``out_dir`` must not exist: vLLM caches adapters by path, so every version needs a new one."""
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise FileExistsError(f"{out_dir} exists; publish every adapter version to a new folder")
        with atomic_dir(out_dir, tmp=out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex}", durable=True) as tmp:
            dtype = self.publish_dtype
            tensors = {key: p.detach().to("cpu", dtype=dtype or p.dtype, copy=True).contiguous()
                       for key, p in self._params.items()}
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            (tmp / ADAPTER_CONFIG).write_text(self._adapter_config_text)
        return out_dir

    def load_adapter_weights(self, adapter_dir: Path) -> None:
        """Reset the LoRA weights to a saved version and forget the optimizer state (rollback).

        The version counter is not changed: it counts accepted steps and stays monotonic."""
        tensors = load_file(str(Path(adapter_dir) / ADAPTER_WEIGHTS))
        missing, unexpected = self._params.keys() - tensors.keys(), tensors.keys() - self._params.keys()
        if missing or unexpected:
            raise ValueError(f"{adapter_dir}: adapter keys differ from the learner's: "
                             f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
        for key, param in self._params.items():
            if tensors[key].shape != param.shape:
                raise ValueError(f"{adapter_dir}: {key} has shape {tuple(tensors[key].shape)}, "
                                 f"expected {tuple(param.shape)}")
            if not bool(torch.isfinite(tensors[key]).all()):
                raise ValueError(f"{adapter_dir}: {key} holds non-finite values")
        with torch.no_grad():
            for key, param in self._params.items():
                param.copy_(tensors[key].to(param.dtype))
        self._optimizer = self._new_optimizer()

    @property
    def adapter_num_bytes(self) -> int:
        """Size of one published adapter (weights in ``publish_dtype``)."""
        size = self.publish_dtype.itemsize if self.publish_dtype else None
        return sum(p.numel() * (size or p.element_size()) for p in self._params.values())

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights keyed as in the PEFT file (for tests and checksums)."""
        return {key: p.detach().clone() for key, p in self._params.items()}

    # ----- training ---------------------------------------------------------------------------------

    def _train(self, sequences: list[PreparedSequence], summary: StepSummary) -> StepResult:
        """Run the epochs as one transaction: any failure or exception restores the weights exactly."""
        snapshot = self._snapshot()
        try:
            failure = self._run_epochs(sequences, summary)
        except BaseException:
            self._restore(snapshot)
            raise
        if failure:
            self._restore(snapshot)
            return summary.rejected(failure, self.version)
        self.version += 1
        return summary.accepted(self.version)

    def _run_epochs(self, sequences: list[PreparedSequence], summary: StepSummary) -> str:
        """The configured number of updates on one batch; the first failure's reason, or ""."""
        batches = self._micro_batches(sequences)
        normalizer = _normalizer(sequences, self.config.aggregation)
        for epoch in range(self.config.num_epochs):
            failure, totals, grad_norm = self._epoch(batches, normalizer, first_epoch=epoch == 0)
            if epoch == 0:
                summary.record(totals, grad_norm)
            if failure:
                return failure
        return ""

    def _epoch(self, batches: list[MicroBatch], normalizer: float, *,
               first_epoch: bool) -> tuple[str, StepTotals, float]:
        """Accumulate, check, clip, update: (failure reason or "", totals, grad norm before clipping)."""
        self._optimizer.zero_grad(set_to_none=True)
        totals = self._accumulate(batches, normalizer, first_epoch=first_epoch)
        if totals.failure:
            return totals.failure, totals, math.nan
        grad_norm = self._clip_gradients()
        if not math.isfinite(grad_norm):
            return f"non-finite gradient (norm {grad_norm})", totals, grad_norm
        return self._apply_update(), totals, grad_norm

    def _accumulate(self, batches: list[MicroBatch], normalizer: float, *, first_epoch: bool) -> StepTotals:
        """Backward of every micro-batch, each divided by the full batch's normalizer so grads add up."""
        totals = StepTotals()
        for batch in batches:
            loss, stats = self._micro_batch_loss(batch, normalizer, totals, first_epoch=first_epoch)
            if not bool(torch.isfinite(loss)):
                totals.loss += float(loss)
                totals.failure = f"non-finite loss ({float(loss)})"
                return totals
            loss.backward()
            totals.add(loss.item(), int(batch.loss_mask[:, batch.start:].sum()), stats)
        return totals

    def _micro_batch_loss(self, batch: MicroBatch, normalizer: float, totals: StepTotals, *,
                          first_epoch: bool) -> tuple[torch.Tensor, dict[str, float]]:
        logp = self._token_logprobs(batch)  # (b, K-1)
        mask = batch.loss_mask[:, batch.start:]  # (b, K-1)
        if first_epoch:  # the sampler's log-probs are the old policy; the learner's own where none came
            old = batch.old_logp[:, batch.start:]  # (b, K-1), NaN where none came
            given = ~torch.isnan(old)
            totals.add_gaps((logp.detach() - old)[given & (mask > 0)].abs())
            batch.old_logp[:, batch.start:] = torch.where(given, old, logp.detach())
        ref_logp = self._reference_logprobs(batch) if self.config.kl_beta > 0 else None
        return grpo_loss(logp, batch.old_logp[:, batch.start:], batch.advantages, mask,
                         clip_eps=self.config.clip_eps, clip_eps_high=self.config.clip_eps_high,
                         aggregation=self.config.aggregation, ref_logp=ref_logp, kl_beta=self.config.kl_beta,
                         normalizer=normalizer)

    def _token_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """(b, K-1) log-probs of tokens start+1..T-1 (K = T − start), ``logit_chunk_size`` positions'
        logits at a time (``grpo.chunked_token_logprobs``): the (b, K, V) logits never exist."""
        if torch.is_grad_enabled():
            self.recompute.prepare(batch.input_ids.numel())
        with autocast(self.config):
            hidden = self._decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                   use_cache=False).last_hidden_state  # (b, T, H)
            scored = hidden[:, batch.start:-1]  # (b, K-1, H): the last position scores no token
            targets = batch.input_ids[:, batch.start + 1:]  # (b, K-1)
            logp = chunked_token_logprobs(scored.reshape(-1, scored.shape[-1]), targets.reshape(-1), self._head,
                                          self.config.temperature, self.config.logit_chunk_size,
                                          self._token_mask(batch))  # (b·(K-1),)
        return logp.view(targets.shape)  # (b, K-1)

    def _token_mask(self, batch: MicroBatch) -> TokenMask | None:
        """The grammar masks of the batch's spans sampled under a regex (built once per micro-batch). A span
        the grammar rejects was not sampled under it: it leaves the loss, with a warning."""
        if not batch.grammar_runs:
            return None
        if batch.token_mask is None:
            rows, bitmasks = [], []
            for run in batch.grammar_runs:
                tokens = batch.input_ids[run.seq, run.first:run.first + run.length].tolist()
                bitmask = self._grammar.bitmask(run.regex, tokens)
                if bitmask is None:
                    log.warning("a Planner span of %d tokens does not match the regex it was sampled under; "
                                "left out of the update", run.length)
                    batch.loss_mask[run.seq, run.first - 1:run.first - 1 + run.length] = 0.0
                    continue
                rows.append(torch.arange(run.row, run.row + run.length))
                bitmasks.append(bitmask)
            device = batch.input_ids.device
            batch.token_mask = TokenMask(torch.cat(rows).to(device), torch.cat(bitmasks).to(device)) if rows else \
                TokenMask(torch.zeros(0, dtype=torch.long, device=device), torch.zeros((0, 1), dtype=torch.int32,
                                                                                      device=device))
        return batch.token_mask

    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """The KL reference: the same model with the adapter disabled."""
        with torch.no_grad(), self.model.disable_adapter():
            return self._token_logprobs(batch)

    def _clip_gradients(self) -> float:
        """The global grad norm before clipping; grads are clipped in place when configured (and finite)."""
        max_norm = self.config.max_grad_norm or math.inf
        return float(torch.nn.utils.clip_grad_norm_(list(self._params.values()), max_norm))

    def _apply_update(self) -> str:
        """The optimizer step; a non-empty reason when it failed or made any weight non-finite."""
        try:
            self._optimizer.step()
        except RuntimeError as err:  # e.g. an lr so large the step size overflows float32
            return f"optimizer step failed: {err}"
        self._optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            is_finite = all(bool(torch.isfinite(p).all()) for p in self._params.values())
        return "" if is_finite else "non-finite LoRA weights after the optimizer step"

    def _micro_batches(self, sequences: list[PreparedSequence]) -> list[MicroBatch]:
        return micro_batches(sequences, self.config.micro_batch_size, self._pad_id, self.device)

    # ----- state ------------------------------------------------------------------------------------

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(list(self._params.values()), lr=self.config.lr,
                                 weight_decay=self.config.weight_decay)

    def _snapshot(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Weights and optimizer state before a step, to restore a rejected one exactly."""
        return self.lora_state(), copy.deepcopy(self._optimizer.state_dict())

    def _restore(self, snapshot: tuple[dict[str, torch.Tensor], dict]) -> None:
        weights, optimizer_state = snapshot
        with torch.no_grad():
            for key, param in self._params.items():
                param.copy_(weights[key])
        self._optimizer.load_state_dict(optimizer_state)
        self._optimizer.zero_grad(set_to_none=True)

# ----- helpers --------------------------------------------------------------------------------------


def _lora_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Trainable weights keyed by their name in a PEFT file (``...q_proj.lora_A.weight``, as vLLM reads)."""
    params = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if not _LORA_PARAM.search(name):
            raise ValueError(f"trainable weight {name!r} is not a LoRA A/B matrix; vLLM cannot serve it")
        params[_LORA_PARAM.sub(r".\1.weight", name)] = param
    if not params:
        raise ValueError("the adapter has no trainable LoRA weights")
    return params


def _normalizer(sequences: list[PreparedSequence], aggregation: str) -> float:
    """The full batch's loss denominator: sequences ("grpo") or Planner tokens ("dapo")."""
    if aggregation == "grpo":
        return float(len(sequences))
    return float(sum(sum(s.mask) for s in sequences))
