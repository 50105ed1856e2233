"""Which confidence in the closed-book answer chooses best between it and the evidence answer, measured offline
on the dev records ``bench/calibrate_choice.py`` wrote (each question's closed-book answer, its log-probs, the
evidence answer, the passages, and whether each answer matches gold).

For every record the Manager's model (loaded with transformers, on CPU, from the folder the engine loads)
scores the recorded closed-book answer token by token under the closed-book prompt (``prompts.CLOSED_BOOK``
in the model's chat template; teacher-forced, so a signal scores the answer the loop got, not a new greedy
one the CPU's numerics may change), answers that prompt ``--num-samples`` more times at ``--temperature``
(plain ancestral sampling: no top-k, no top-p, as vLLM samples by default), and scores both recorded answers
under the evidence-answer prompt with the record's passages (``prompts.EVIDENCE_ANSWER``, cut to
``agent.evidence_max_words`` as the loop cuts them). Each signal below is turned into the choice the loop
makes (closed book when the signal clears a threshold, else the evidence answer: ``ClosedBookChoice``'s rule)
at the threshold that maximises dev accuracy (``calibrate_choice.best_threshold``), and, to show how much of
that is a threshold fitted to these same questions, at the threshold fitted on the other questions
(leave-one-out). ``auroc``: how well the signal alone ranks right closed-book answers above wrong ones.

    mean_logprob       mean token log-prob of the answer, as the engine recorded it: the current signal
                       (Mallen et al., 2023; FLARE, Jiang et al., 2023)
    span_logprob       mean log-prob of the answer's tokens that are not the question's words: the answer
                       span's likelihood, not the copied question's (Jiang et al., 2021, "How Can We Know
                       When Language Models Know?")
    agreement          share of samples that match the answer, or that the answer matches
                       (``answer_match.is_match``): self-consistency as confidence (Wang et al., 2023;
                       SelfCheckGPT, Manakul et al., 2023; semantic entropy's clusters, Kuhn et al., 2023,
                       with string match for entailment)
    content_agreement  mean over samples of the share of the answer's content tokens (normalised tokens
                       not in the question; all of them when none is new) that the sample holds
                       (SelfCheckGPT's n-gram variant, on the answer's own words)
    lexical_similarity mean token F1 of the answer against each sample (the lexical-similarity baseline of
                       Kuhn et al., 2023, and Lin et al., 2023, "Generating with Confidence")
    reader_likelihood  mean log-prob of the closed-book answer given the passages (the reader's
                       likelihood of a candidate, as RAG scores answers, Lewis et al., 2020)
    reader_margin      reader_likelihood minus the evidence answer's under the same prompt: the reader
                       compares the two candidates
    reader_pmi         reader_likelihood minus the closed-book log-prob without passages: what the
                       passages add to the answer (domain-conditional PMI, Holtzman et al., 2021)

    python bench/closed_book_confidence.py --records bench/results/calibrate_choice_dev.json \
        --threads 1 --cache /tmp/closed_book_confidence.jsonl --out bench/results/closed_book_confidence_dev.json
    python bench/closed_book_confidence.py --records bench/results/closed_book_confidence_dev.json \
        --asked bench/results/closed_book_confidence_dev.json          # the figures again, no model
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.calibrate_choice import best_threshold  # noqa: E402

from bench.results_io import Result  # noqa: E402
from mia_engine.agent import prompts  # noqa: E402
from mia_engine.agent.answer_match import is_match, tokens  # noqa: E402
from mia_engine.config.agent import AgentConfig  # noqa: E402
from mia_engine.tools.calls import truncate_words  # noqa: E402

QUESTION_KEYS = ("id", "split", "question", "gold", "closed_book", "logprobs", "own", "closed_book_match", "own_match")
"""What the output keeps of each record, beside what the model said (``asked``): with it, the output file is
its own ``--records`` and ``--asked`` (the signals again, no model, no passages)."""
SIGNALS = ("mean_logprob", "span_logprob", "agreement", "content_agreement", "lexical_similarity",
           "reader_likelihood", "reader_margin", "reader_pmi")


# ---- asking the model (transformers, offline) --------------------------------------------------------


class LocalModel:
    """The Manager's model in transformers: prompts in its chat template, sampled answers, scored answers."""

    def __init__(self, folder: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()

    def prompt_ids(self, user_text: str) -> list[int]:
        """One user turn in the chat template, with the generation prompt (``RoleHandle.render_chat``)."""
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt: list[int], *, max_tokens: int, num_samples: int = 1,
                 temperature: float = 0.0) -> list[tuple[list[int], list[float]]]:
        """(token ids, each one's log-prob before temperature) of ``num_samples`` answers; greedy at 0."""
        torch = self.torch
        ids = torch.tensor([prompt])
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
            else {"do_sample": False}
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_tokens, num_return_sequences=num_samples,
                                      output_logits=True, return_dict_in_generate=True, **sampling)
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # (n, T, V), raw: before temperature
        new = out.sequences[:, len(prompt):]  # (n, T)
        picked = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (n, T)
        eos = self.tokenizer.eos_token_id
        answers = []
        for row, lp in zip(new.tolist(), picked.tolist()):
            end = row.index(eos) if eos in row else len(row)
            answers.append((row[:end], lp[:end]))
        return answers

    def score(self, prompt: list[int], answer: str) -> tuple[list[int], list[float]]:
        """(token ids, log-probs) of ``answer`` after ``prompt``."""
        torch = self.torch
        answer_ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + answer_ids])
        with torch.no_grad():
            logprobs = self.model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)  # (A, V)
        return answer_ids, logprobs.gather(-1, torch.tensor(answer_ids).unsqueeze(-1)).squeeze(-1).tolist()

    def text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.decode([t]) for t in token_ids]


def sample_record(model: LocalModel, record: dict, args: argparse.Namespace) -> dict:
    """The record's closed-book answer scored token by token under the closed-book prompt, ``num_samples``
    new answers to that prompt, and both recorded answers' log-probs under the evidence prompt."""
    prompt = model.prompt_ids(prompts.CLOSED_BOOK.render(question=record["question"]))
    answer_ids, answer_lp = model.score(prompt, record["closed_book"]) if record["closed_book"] else ([], [])
    samples = model.generate(prompt, max_tokens=args.max_tokens, num_samples=args.num_samples,
                             temperature=args.temperature)
    return {"answer_tokens": model.token_texts(answer_ids), "answer_logprobs": answer_lp,
            "samples": [model.text(ids) for ids, _ in samples], "reader": read_answers(model, record)}


def read_answers(model: LocalModel, record: dict) -> dict[str, list[float]]:
    """{closed_book, own: each answer's token log-probs under the evidence prompt}; {} without passages."""
    if not record["evidence"]:
        return {}
    passages = truncate_words("\n".join(dict.fromkeys(record["evidence"])), AgentConfig().evidence_max_words)
    prompt = model.prompt_ids(prompts.EVIDENCE_ANSWER.render(passages=passages, question=record["question"]))
    return {side: model.score(prompt, record[side])[1] for side in ("closed_book", "own") if record[side]}


# ---- the signals (pure) ------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def content_tokens(question: str, answer: str) -> list[str]:
    """The answer's normalised tokens that are not the question's; all of them when none is new (an answer
    that picks one of the question's own options)."""
    asked = set(tokens(question))
    answer_tokens = tokens(answer)
    return [t for t in answer_tokens if t not in asked] or answer_tokens


def span_logprob(question: str, token_texts: Sequence[str], logprobs: Sequence[float]) -> float:
    """Mean log-prob of the tokens that carry a content token of the answer (not the question's words)."""
    asked = set(tokens(question))
    span = [lp for text, lp in zip(token_texts, logprobs) if any(t not in asked for t in tokens(text))]
    return mean(span) if span else mean(logprobs)


def agreement(answer: str, samples: Sequence[str]) -> float:
    """Share of samples that match the answer, or that the answer matches (``is_match``)."""
    if not answer or not samples:
        return 0.0
    return sum(is_match(s, [answer]) or is_match(answer, [s]) for s in samples) / len(samples)


def content_agreement(question: str, answer: str, samples: Sequence[str]) -> float:
    """Mean over samples of the share of the answer's content tokens each sample holds."""
    content = content_tokens(question, answer)
    if not content or not samples:
        return 0.0
    return mean([sum(t in set(tokens(s)) for t in content) / len(content) for s in samples])


def token_f1(answer: str, sample: str) -> float:
    """SQuAD's token F1 of two texts (normalised tokens, as multisets)."""
    a, b = Counter(tokens(answer)), Counter(tokens(sample))
    common = sum((a & b).values())
    return 0.0 if not common else 2 * common / (sum(a.values()) + sum(b.values()))


def reader_signals(record: dict, reader: dict[str, list[float]]) -> dict[str, float]:
    """The reader's likelihood of the closed-book answer given the passages, its margin over the evidence
    answer's and its gain over the closed-book prompt's; 0 where a side is missing (the choice is then fixed
    by the empty side, or has no passages to read)."""
    if "closed_book" not in reader:
        return {"reader_likelihood": 0.0, "reader_margin": 0.0, "reader_pmi": 0.0}
    closed_book = mean(reader["closed_book"])
    own = mean(reader["own"]) if "own" in reader else closed_book
    return {"reader_likelihood": closed_book, "reader_margin": closed_book - own,
            "reader_pmi": closed_book - mean(record["logprobs"]) if record["logprobs"] else 0.0}


def signals(record: dict, asked: dict) -> dict[str, float]:
    question, answer, samples = record["question"], record["closed_book"], asked["samples"]
    return {"mean_logprob": mean(record["logprobs"]),
            "span_logprob": span_logprob(question, asked["answer_tokens"], asked["answer_logprobs"]),
            "agreement": agreement(answer, samples),
            "content_agreement": content_agreement(question, answer, samples),
            "lexical_similarity": mean([token_f1(answer, s) for s in samples]),
            **reader_signals(record, asked["reader"])}


# ---- the choice by each signal (pure) ----------------------------------------------------------------


def chosen_match(record: dict, score: float, threshold: float) -> bool:
    """``ClosedBookChoice``'s rule on one record: the closed-book answer when it is non-empty and the
    evidence answer empty or the score clears the threshold."""
    if not record["closed_book"]:
        return record["own_match"]
    if not (record["own"] or "").strip() or score >= threshold:
        return record["closed_book_match"]
    return record["own_match"]


def evaluate(records: Sequence[dict], scores: Sequence[float], threshold: float) -> dict:
    chosen = [chosen_match(r, s, threshold) for r, s in zip(records, scores)]
    lost = sum(r["closed_book_match"] and not c for r, c in zip(records, chosen))
    return {"threshold": threshold, "accuracy": sum(chosen) / len(records), "num_correct": sum(chosen),
            "num_closed_book_right_lost": lost}


def fit(records: Sequence[dict], scores: Sequence[float]) -> float:
    def accuracy(t: float) -> float:
        return sum(chosen_match(r, s, t) for r, s in zip(records, scores))
    return best_threshold(scores, accuracy)[0]


def leave_one_out(records: Sequence[dict], scores: Sequence[float]) -> dict:
    """Each question chosen with the threshold fitted on the others."""
    chosen = []
    for i, (r, s) in enumerate(zip(records, scores)):
        rest = [x for j, x in enumerate(records) if j != i]
        threshold = fit(rest, [x for j, x in enumerate(scores) if j != i])
        chosen.append(chosen_match(r, s, threshold))
    lost = sum(r["closed_book_match"] and not c for r, c in zip(records, chosen))
    return {"accuracy": sum(chosen) / len(records), "num_closed_book_right_lost": lost}


def auroc(records: Sequence[dict], scores: Sequence[float]) -> float:
    """How well the score ranks right closed-book answers above wrong ones (0.5: not at all)."""
    right = [s for r, s in zip(records, scores) if r["closed_book_match"]]
    wrong = [s for r, s in zip(records, scores) if not r["closed_book_match"]]
    if not right or not wrong:
        return float("nan")
    return sum((a > b) + 0.5 * (a == b) for a in right for b in wrong) / (len(right) * len(wrong))


def report(records: Sequence[dict], per_signal: dict[str, list[float]]) -> dict:
    out = {"num_questions": len(records),
           "num_closed_book_right": sum(r["closed_book_match"] for r in records),
           "evidence_only": sum(r["own_match"] for r in records) / len(records),
           "closed_book_only": sum(r["closed_book_match"] for r in records) / len(records),
           "oracle": sum(r["own_match"] or r["closed_book_match"] for r in records) / len(records)}
    for name, scores in per_signal.items():
        out[name] = {**evaluate(records, scores, fit(records, scores)), "auroc": auroc(records, scores),
                     "leave_one_out": leave_one_out(records, scores)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True,
                        help="a file bench/calibrate_choice.py wrote, or one this script wrote (--out)")
    parser.add_argument("--model", default="embedded:smollm2", help="the Manager's model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=40, help="per sample (most recorded answers are shorter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--asked", type=Path, help="answers this script wrote before (--out): no model")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--cache", type=Path, help="JSON lines of the answers asked so far (resumable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("closed_book_confidence")
    document = json.loads(args.records.read_text())
    records = document.get("records") or document["questions"]
    asked = json.loads(args.asked.read_text())["asked"] if args.asked else ask_all(records, args)
    per_signal = {name: [] for name in SIGNALS}
    for r, a in zip(records, asked):
        for name, value in signals(r, a).items():
            per_signal[name].append(value)
    summary = report(records, per_signal)
    for name in SIGNALS:
        figures = summary[name]
        result.add_run(signal=name, **{k: v for k, v in figures.items() if k != "leave_one_out"},
                       **{f"leave_one_out_{k}": v for k, v in figures["leave_one_out"].items()})
    scores = {name: [v if math.isfinite(v) else None for v in values] for name, values in per_signal.items()}
    result.write(args.out, summary=summary, args=args, scores=scores, asked=asked,
                 questions=[{k: r[k] for k in QUESTION_KEYS} for r in records])


def ask_all(records: Sequence[dict], args: argparse.Namespace) -> list[dict]:
    """Every record asked again, each appended to ``--cache`` (JSON lines) as it is done: a run cut short
    goes on where it stopped."""
    import torch

    from mia_engine.models.cache import default_home
    from mia_engine.models.embedded import model_dir

    cache = args.cache or Path("/dev/null")
    asked = [json.loads(line) for line in cache.read_text().splitlines()] if args.cache and cache.exists() else []
    torch.manual_seed(args.seed + len(asked))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = LocalModel(model_dir(args.model, default_home()), args.dtype)
    start = time.monotonic()
    with cache.open("a") as sink:
        for i, record in enumerate(records[len(asked):], start=len(asked)):
            asked.append(sample_record(model, record, args))
            sink.write(json.dumps(asked[-1], ensure_ascii=False) + "\n")
            sink.flush()
            print(f"{i + 1}/{len(records)} {time.monotonic() - start:.0f}s", file=sys.stderr, flush=True)
    return asked


if __name__ == "__main__":
    main()
