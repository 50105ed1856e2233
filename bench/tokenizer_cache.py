"""The serving process's tokenizer memory: ``tokenizers`` keeps its BPE word cache per thread.

    python bench/tokenizer_cache.py --out bench/results/tokenizer_cache.json

The default config's model tokenizer encodes ``--prompts`` Executor-sized prompts (``--passages`` corpus
passages each, the batch path the server uses) on 1, 2 and 6 threads: one thread, the engine's
``tokenizer_threads`` default, and the event loop's default executor on a 2-core machine
(``min(32, cores + 4)`` threads), which ran the tokenizer before. Each run has a fresh tokenizer and fresh
threads; reported: the bytes malloc holds once every prompt is encoded (the threads still alive, so their
caches too), and milliseconds per prompt. The library fills each thread's cache up to 10,000 words, so
what stays held scales with the threads that tokenize.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.results_io import Result  # noqa: E402
from bench.stats import malloc_bytes_in_use, report  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.models.cache import default_home  # noqa: E402
from mia_engine.models.embedded import model_dir  # noqa: E402
from mia_engine.tools.corpus import load_corpus  # noqa: E402


def prompts(corpus_source: str, count: int, passages: int, seed: int) -> list[str]:
    corpus = load_corpus(corpus_source).passages
    rng = random.Random(seed)
    return ["\n\n".join(f"{p.title}: {p.text}" for p in rng.sample(corpus, passages)) for _ in range(count)]


def held_after(tokenizer_dir: Path, texts: list[str], threads: int) -> dict[str, Any]:
    """Bytes held and milliseconds per prompt once ``texts`` are encoded on ``threads`` fresh threads."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # a fresh BPE: caches of its own
    with ThreadPoolExecutor(threads) as pool:
        before = malloc_bytes_in_use()
        start = time.perf_counter()
        for _ in pool.map(lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]), texts):
            pass
        seconds = time.perf_counter() - start
        held = malloc_bytes_in_use() - before
    return {"threads": threads, "held_mb": held / 1e6, "ms_per_prompt": seconds / len(texts) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=600)
    parser.add_argument("--passages", type=int, default=5)
    parser.add_argument("--threads", default="1,2,6")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("tokenizer_cache")
    from transformers import AutoTokenizer

    config = load_config("default")
    engine = next(iter(config.engines.values()))
    tokenizer_dir = model_dir(engine.model, default_home())
    texts = prompts(config.tools.corpus, args.prompts, args.passages, args.seed)
    scratch = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in texts:  # each str keeps its UTF-8 copy from the first encode on: made here, not counted below
        scratch(text, add_special_tokens=False)
    runs = [held_after(tokenizer_dir, texts, int(n)) for n in args.threads.split(",")]
    one = runs[0]["held_mb"]
    for run in runs:
        run["held_vs_first"] = run["held_mb"] / one if one else None
    for run in runs:
        result.add_run(**run)
    report({"model": engine.model, "prompts": args.prompts, "passages_per_prompt": args.passages}, args.out,
           result=result, args=args)


if __name__ == "__main__":
    main()
