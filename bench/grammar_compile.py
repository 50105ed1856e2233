"""Compile time of the widest structured-output constraints the request limits accept.

    python bench/grammar_compile.py --vocab tiny,default,152000 --out bench/results/grammar_compile.json

Each family of wide schema (long regex repeats, long string lengths, many optional properties, ...) grows
with one size ``k``. For each vocabulary the largest ``k`` that the server accepts (``limits.max_grammar_cost``
over the estimate of ``server/grammar_cost.py`` at that vocabulary, and the body's byte cap) is found from
the estimate alone, then that schema and the ones at a quarter and half of its cost are compiled as vLLM's
xgrammar backend compiles a request (validation, then ``compile_json_schema``). Reported per compile:
seconds, and milliseconds per unit of estimated cost at a 32k vocabulary (the estimate's unit).

Vocabularies: ``tiny`` (the tests' model), ``default`` (the default config's model), or a number: the default
model's tokens extended to that size with concatenations of two of its tokens (a stand-in for an 8B-class
model's vocabulary, which nothing here can download). Each compile runs in a child process that is killed
after ``--timeout-s``, so a schema the estimate misjudges shows as a timeout instead of hanging the run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.results_io import Result  # noqa: E402
from bench.stats import report  # noqa: E402
from mia_engine.config import LimitsConfig, load_config  # noqa: E402
from mia_engine.server.errors import BadRequest  # noqa: E402
from mia_engine.server.grammar_cost import schema_cost, vocab_factor  # noqa: E402
from mia_engine.server.limits import check_schema  # noqa: E402

Family = Callable[[int], Any]

FAMILIES: dict[str, Family] = {
    "pattern .{0,k}": lambda k: {"type": "string", "pattern": f".{{0,{k}}}"},
    "pattern a{k}": lambda k: {"type": "string", "pattern": f"a{{{k}}}"},
    "pattern \\d{k}": lambda k: {"type": "string", "pattern": f"\\d{{{k}}}"},
    "pattern [^x]{0,k}": lambda k: {"type": "string", "pattern": f"[^x]{{0,{k}}}"},
    "maxLength k": lambda k: {"type": "string", "maxLength": k},
    "minLength k": lambda k: {"type": "string", "minLength": k},
    "k strings of maxLength 1000 + i": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)],
                                                 "properties": {f"p{i}": {"type": "string", "maxLength": 1000 + i}
                                                                for i in range(k)}},
    "k strings of maxLength 100": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)],
                                            "properties": {f"p{i}": {"type": "string", "maxLength": 100}
                                                           for i in range(k)}},
    "k optional properties": lambda k: {"type": "object", "properties": {str(i): {} for i in range(k)}},
    "k integer ranges": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)], "properties": {
        f"p{i}": {"type": "integer", "minimum": -987654321 + i, "maximum": 98765432 - i} for i in range(k)}},
    "k date-time formats": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)], "properties": {
        f"p{i}": {"type": "string", "format": "date-time"} for i in range(k)}},
    "k patterns [a-z]{100}": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)], "properties": {
        f"p{i}": {"type": "string", "pattern": "[a-z]{100}"} for i in range(k)}},
    "nested repeats ((.{0,k}){k}){k}": lambda k: {"type": "string", "pattern": f"((.{{0,{k}}}){{{k}}}){{{k}}}"},
    "enum of k values": lambda k: {"enum": [f"v{i}" for i in range(k)]},
    "anyOf k objects": lambda k: {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "string"}},
                                             "required": [f"k{i}"]} for i in range(k)]},
    "k required string properties": lambda k: {"type": "object", "required": [f"p{i}" for i in range(k)],
                                               "properties": {f"p{i}": {"type": "string"} for i in range(k)}},
    "array minItems k": lambda k: {"type": "array", "items": {"type": "integer"}, "minItems": k},
    "array maxItems k": lambda k: {"type": "array", "items": {"type": "integer"}, "maxItems": k},
}
"""Schema families that are cheap to send and, unbounded, slow to compile; each grows with ``k``."""

MAX_K = 10**9


def accepted(schema: Any, limits: LimitsConfig, vocab_size: int) -> bool:
    """The server's check of a schema (its byte cap, its estimated compile cost at ``vocab_size``; 0: the
    budget of the estimate's reference vocabulary, whatever the vocabulary)."""
    try:
        check_schema("schema", schema, limits, vocab_size)
    except BadRequest:
        return False
    return True


def largest_accepted(family: Family, limits: LimitsConfig, vocab_size: int) -> int | None:
    """The largest ``k`` the server accepts (both checks grow with ``k``), or None when even ``k = 1`` is
    refused; ``MAX_K`` when nothing up to it is refused."""
    if not accepted(family(1), limits, vocab_size):
        return None
    low, high = 1, 2
    while high < MAX_K and accepted(family(high), limits, vocab_size):
        low, high = high, min(high * 4, MAX_K)
    if high == MAX_K and accepted(family(high), limits, vocab_size):
        return MAX_K
    return _last_holding(low, high, lambda k: accepted(family(k), limits, vocab_size))


def at_cost_fraction(family: Family, k_max: int, fraction: float) -> int:
    """The largest ``k`` at most ``k_max`` whose estimated cost is at most ``fraction`` of ``k_max``'s."""
    target = schema_cost(family(k_max)) * fraction
    return _last_holding(1, k_max, lambda k: schema_cost(family(k)) <= target)


def _last_holding(low: int, high: int, holds: Callable[[int], bool]) -> int:
    """The largest ``k`` in ``[low, high)`` for which ``holds`` (which holds up to some ``k`` and not after),
    by bisection, taking ``low`` as holding."""
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if holds(middle) else (low, middle)
    return low


def tokenizer_info(vocab: str, seed: int = 0):
    """xgrammar's view of a vocabulary, built as vLLM's xgrammar backend builds it."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from mia_engine.models.cache import default_home
    from mia_engine.models.embedded import model_dir

    engine = next(iter(load_config("tiny" if vocab == "tiny" else "default").engines.values()))
    tokenizer = AutoTokenizer.from_pretrained(model_dir(engine.model, default_home()))
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    if vocab in ("tiny", "default"):
        return info
    size = int(vocab)
    tokens = list(info.decoded_vocab)
    words = [t for t in tokens if t and t.isascii() and t.strip()]
    rng, seen = random.Random(seed), set(tokens)
    while len(tokens) < size:
        token = rng.choice(words) + rng.choice(words)
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    return xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=size, stop_token_ids=info.stop_token_ids)


def _compile_worker(vocab: str, any_whitespace: bool, jobs: Any, results: Any) -> None:
    import xgrammar as xgr

    info = tokenizer_info(vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
    separators = None if any_whitespace else (",", ":")
    results.put(("ready", info.vocab_size))
    while (schema := jobs.get()) is not None:
        start = time.perf_counter()
        xgr.Grammar.from_json_schema(schema)  # vLLM's validation when the request is added
        compiler.compile_json_schema(schema, any_whitespace=any_whitespace, separators=separators)
        results.put(("done", time.perf_counter() - start))


class Compiler:
    """A child process that compiles schemas one at a time and is restarted after a timeout."""

    def __init__(self, vocab: str, any_whitespace: bool) -> None:
        self._args = (vocab, any_whitespace)
        self._context = multiprocessing.get_context("spawn")
        self.vocab_size = self._start()

    def _start(self) -> int:
        self._jobs, self._results = self._context.Queue(), self._context.Queue()
        self._process = self._context.Process(target=_compile_worker, args=(*self._args, self._jobs, self._results),
                                              daemon=True)
        self._process.start()
        kind, vocab_size = self._results.get(timeout=600)
        assert kind == "ready"
        return vocab_size

    def seconds(self, schema: Any, timeout_s: float) -> float | None:
        """The compile's wall time, or None when it ran past ``timeout_s`` (the child is then replaced)."""
        self._jobs.put(json.dumps(schema))
        try:
            return self._results.get(timeout=timeout_s)[1]
        except Exception:  # queue.Empty: the compile is still running
            self._process.kill()
            self._process.join()
            self._start()
            return None

    def close(self) -> None:
        self._jobs.put(None)
        self._process.join(timeout=10)


def measure(vocab: str, limits: LimitsConfig, any_whitespace: bool, fractions: list[float],
            timeout_s: float, scaled: bool, families: list[str]) -> dict[str, Any]:
    compiler = Compiler(vocab, any_whitespace)
    budget_vocab = compiler.vocab_size if scaled else 0
    rows = []
    for name in families:
        family = FAMILIES[name]
        k_max = largest_accepted(family, limits, budget_vocab)
        if k_max is None:
            rows.append({"family": name, "accepted": False})
            continue
        sizes = sorted({at_cost_fraction(family, k_max, f) if f < 1 else k_max for f in fractions})
        for k in sizes:
            schema = family(k)
            cost = schema_cost(schema)
            seconds = compiler.seconds(schema, timeout_s)
            rows.append({"family": name, "k": k, "schema_bytes": len(msgspec.json.encode(schema)),
                         "estimated_cost": round(cost, 2),
                         "seconds": None if seconds is None else round(seconds, 4),
                         "ms_per_cost": None if seconds is None or cost < 1 else round(seconds * 1e3 / cost, 3)})
            shown = "timeout" if seconds is None else f"{seconds:.3f} s"
            print(f"  {vocab:>8} {name:<34} k={k:<10} cost {cost:9.1f}  {shown}", flush=True)
    compiler.close()
    timed = [r["seconds"] for r in rows if r.get("seconds") is not None]
    return {"vocab": vocab, "vocab_size": compiler.vocab_size, "any_whitespace": any_whitespace,
            "budget_at_this_vocab": limits.max_grammar_cost / vocab_factor(budget_vocab),
            "max_seconds": max(timed, default=None),
            "timeouts": sum(1 for r in rows if "seconds" in r and r["seconds"] is None), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", default="tiny,default,152000",
                        help="comma-separated: tiny, default, or a token count (the default model's, extended)")
    parser.add_argument("--fractions", default="0.25,0.5,1",
                        help="costs compiled, as fractions of the largest accepted")
    parser.add_argument("--any-whitespace", action="store_true",
                        help="compile as an engine without compact_json does (the 8xgpu config)")
    parser.add_argument("--max-grammar-cost", type=int, default=LimitsConfig().max_grammar_cost)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--unscaled", action="store_true",
                        help="the budget of a 32k vocabulary whatever the vocabulary (what the server accepted "
                             "before it scaled costs by the served model's vocabulary)")
    parser.add_argument("--family", action="append", choices=list(FAMILIES), metavar="NAME",
                        help="a family to measure (repeatable; default: all of them)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("grammar_compile")
    limits = msgspec.structs.replace(LimitsConfig(), max_grammar_cost=args.max_grammar_cost)
    fractions = [float(f) for f in args.fractions.split(",")]
    runs = [measure(vocab, limits, args.any_whitespace, fractions, args.timeout_s, not args.unscaled,
                    args.family or list(FAMILIES))
            for vocab in args.vocab.split(",")]
    for run in runs:  # one run per vocabulary; its schemas' timings kept in ``rows``
        result.add_run(**run)
    report({"max_grammar_cost": limits.max_grammar_cost, "max_json_schema_bytes": limits.max_json_schema_bytes,
            "scaled_by_vocabulary": not args.unscaled, "timeout_s": args.timeout_s}, args.out, result=result,
           args=args)


if __name__ == "__main__":
    main()
