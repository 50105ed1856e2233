"""The structured-output mask a Planner token was sampled under, rebuilt for the learner.

vLLM samples a constrained request from the logits with the grammar's bitmask applied (−inf outside the
allowed tokens) and returns the log-probs of those masked logits (``logprobs_mode = "raw_logprobs"``).
For the learner's ratio to be on-policy it must score such a token under the same mask: ``GrammarReplay``
compiles the regex as vLLM's xgrammar backend does (``xgrammar.TokenizerInfo.from_huggingface`` of the
model's tokenizer at the model's vocabulary size, ``GrammarCompiler.compile_regex``, a ``GrammarMatcher``
whose stop tokens are the request's: the tokenizer's end-of-sequence token and the generation config's),
then walks the sampled tokens through the matcher, filling the next-token bitmask before each one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


class GrammarReplay:
    """Per-token bitmasks of token sequences sampled under a regex, for one model's tokenizer.

    The tokenizer and compiler load on first use; each regex compiles once (a Planner uses one or two)."""

    def __init__(self, model_dir: Path, vocab_size: int) -> None:
        self.model_dir = Path(model_dir)
        self.vocab_size = vocab_size
        """The model's vocabulary (its logits' width), which vLLM gives xgrammar too."""
        self._compiler: Any = None
        self._stop_ids: list[int] = []
        self._compiled: dict[str, Any] = {}

    def bitmask(self, regex: str, token_ids: list[int]) -> torch.Tensor | None:
        """(len(token_ids), ⌈V/32⌉) int32: row i holds the tokens the grammar allowed before token i
        (``grpo.TokenMask`` layout); None when the grammar rejects a token (then these were not sampled
        under ``regex`` with this tokenizer, and no mask is the right one)."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self._compile(regex), override_stop_tokens=self._stop_ids or None)
        bitmask = xgr.allocate_token_bitmask(len(token_ids), self.vocab_size)  # (n, W) int32
        for i, token in enumerate(token_ids):
            if matcher.is_terminated():
                return None
            matcher.fill_next_token_bitmask(bitmask, i)
            if not matcher.accept_token(token):
                return None
        return bitmask

    def _compile(self, regex: str) -> Any:
        if regex not in self._compiled:
            self._compiled[regex] = self._grammar_compiler().compile_regex(regex)
        return self._compiled[regex]

    def _grammar_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            self._stop_ids = stop_token_ids(self.model_dir, tokenizer.eos_token_id)
        return self._compiler


def stop_token_ids(model_dir: Path, eos_token_id: int | None) -> list[int]:
    """The tokens that end a request, as vLLM collects them (``SamplingParams.update_from_generation_config``):
    the tokenizer's end-of-sequence token and the generation config's ``eos_token_id`` (one or a list)."""
    ids = set() if eos_token_id is None else {int(eos_token_id)}
    try:
        found = json.loads((Path(model_dir) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        found = None
    if found is not None:
        ids.update([found] if isinstance(found, int) else found)
    return sorted(ids)
