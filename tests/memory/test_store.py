"""The store's rules on real FAISS and the real score kernel, with hand-made embeddings."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from numpy.random import Generator

from mia_engine.config.memory import ScoreWeights
from mia_engine.memory.entries import InvalidMemory, MemoryNotFound, MetaPlanPair, vector_to_bytes
from mia_engine.memory.jsonl import decode_jsonl, encode_jsonl
from mia_engine.memory.retrieval import SearchQuery
from mia_engine.memory.store import ExperienceStore

from .factories import DIM, StoreOpener, FakeClock, make_entry, memory_config, state_of, unit


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng(42)


def test_incorrect_duplicate_is_always_replaced(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    key = unit(rng)
    first = store.add(make_entry(key, label="incorrect", summary="short"))
    second = store.add(make_entry(key, label="incorrect", summary="a much longer failure summary"))
    assert second.action == "replaced" and second.replaced_id == first.id
    assert first.id not in store and len(store) == 1


def test_correct_duplicate_is_replaced_only_by_a_shorter_summary(
    new_store: StoreOpener, tmp_path: Path, rng: Generator,
) -> None:
    store = new_store(tmp_path)
    key = unit(rng)
    first = store.add(make_entry(key, summary="1. step one 2. step two"))
    longer = store.add(make_entry(key, summary="1. step one 2. step two 3. step three"))
    assert longer.action == "kept_existing" and longer.id == first.id
    shorter = store.add(make_entry(key, summary="1. step"))
    assert shorter.action == "replaced" and shorter.replaced_id == first.id
    assert store.get(shorter.id).workflow_summary == "1. step" and len(store) == 1


def test_duplicates_are_per_bucket_label_and_caption(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    key, caption_a, caption_b = unit(rng), unit(rng), unit(rng)
    results = [
        store.add(make_entry(key, label="correct")),
        store.add(make_entry(key, label="incorrect")),  # other label
        store.add(make_entry(key, category="time")),  # other category
        store.add(make_entry(key, key_c=caption_a)),  # other modality
        store.add(make_entry(key, key_c=caption_b)),  # same question, other image
    ]
    assert [r.action for r in results] == ["inserted"] * 5 and len(store) == 5


def test_replace_threshold_is_configurable(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    key = unit(rng)
    near = key + 0.2 * unit(rng)
    near /= np.linalg.norm(near)
    cosine = float(key @ near)
    assert 0.9 < cosine < 0.9999
    strict = new_store(tmp_path / "strict")
    strict.add(make_entry(key, label="incorrect"))
    assert strict.add(make_entry(near, label="incorrect")).action == "inserted"
    loose = new_store(tmp_path / "loose", memory_config(replace_threshold=0.9))
    loose.add(make_entry(key, label="incorrect"))
    assert loose.add(make_entry(near, label="incorrect")).action == "replaced"


def test_record_outcome_counts_uses_and_successes(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    a, b = (store.add(make_entry(unit(rng))).id for _ in range(2))
    assert store.record_outcome([a, b, a, "gone"], True) == 2  # duplicates once, unknown ids skipped
    assert store.record_outcome([a], False) == 1
    assert (store.get(a).num_uses, store.get(a).num_successes) == (2, 1)
    assert (store.get(b).num_uses, store.get(b).num_successes) == (1, 1)
    store.close()
    reopened = new_store(tmp_path)
    assert (reopened.get(a).num_uses, reopened.get(a).num_successes) == (2, 1)


def test_clear_policy_none_keeps_everything(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    for _ in range(3):
        store.add(make_entry(unit(rng)))
    store.clear_after_update()
    assert store.clear_after_update().removed_ids == [] and len(store) == 3


def test_clear_policy_drop_unused_spares_fresh_and_used_memories(
    new_store: StoreOpener, tmp_path: Path, rng: Generator,
) -> None:
    store = new_store(tmp_path, memory_config(clear_policy="drop_unused"))
    old_unused, old_used = store.add(make_entry(unit(rng))).id, store.add(make_entry(unit(rng))).id
    assert store.clear_after_update().removed_ids == []  # nobody has had a full update yet
    store.record_outcome([old_used], False)
    fresh = store.add(make_entry(unit(rng))).id
    assert store.clear_after_update().removed_ids == [old_unused]
    assert fresh in store and old_used in store
    store.close()
    reopened = new_store(tmp_path, memory_config(clear_policy="drop_unused"))  # last clear time survives
    assert reopened.clear_after_update().removed_ids == [fresh]


def test_clear_policy_cap_keeps_the_most_valuable(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path, memory_config(clear_policy="cap", max_num_entries=2, max_num_meta_plans=1))
    ids = [store.add(make_entry(unit(rng))).id for _ in range(4)]
    store.record_outcome([ids[0]], True)  # Val 1/2
    store.record_outcome([ids[1]], True)
    store.record_outcome([ids[1]], True)  # Val 2/3
    store.record_outcome([ids[2]], False)  # Val 0, older than ids[3]
    first_pair = store.add_meta_plan(MetaPlanPair("p1", "q", "a", "b", question_embedding=vector_to_bytes(unit(rng))))
    store.add_meta_plan(MetaPlanPair("p2", "q", "a", "b", question_embedding=vector_to_bytes(unit(rng))))
    cleared = store.clear_after_update()
    assert sorted(cleared.removed_ids) == sorted([ids[2], ids[3]])
    assert cleared.removed_meta_plan_ids == [first_pair.id]


def test_search_matches_a_hand_computation(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    labels = ["correct", "incorrect", "correct", "incorrect", "correct", "correct"]
    entries = [make_entry(unit(rng), label=label) for label in labels]
    for entry in entries:
        store.add(entry)
    store.record_outcome([entries[0].id, entries[1].id], True)
    store.record_outcome([entries[0].id, entries[4].id], False)
    query = unit(rng)
    result = store.search(query, None, store.bucket_key("text", None), num_positive=2, num_negative=3)

    expected = _hand_scores(store, [e.id for e in entries], query, ScoreWeights())
    for hits, label in ((result.positives, "correct"), (result.negatives, "incorrect")):
        of_label = [eid for eid in expected if store.get(eid).label == label]
        ranked = sorted(of_label, key=lambda eid: -expected[eid][0])
        assert [hit.entry.id for hit in hits] == ranked[: 2 if label == "correct" else 3]
        for hit in hits:
            score, sim, sim_norm, value, freq = expected[hit.entry.id]
            terms = (hit.score, hit.sim, hit.sim_norm, hit.value, hit.freq)
            assert terms == pytest.approx((score, sim, sim_norm, value, freq), abs=1e-5)


def test_search_with_caption_weights_both_cosines(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    entries = [make_entry(unit(rng), key_c=unit(rng), label=label) for label in ("correct", "correct", "incorrect")]
    for entry in entries:
        store.add(entry)
    query_q, query_c = unit(rng), unit(rng)
    result = store.search(query_q, query_c, store.bucket_key("text_image", None), num_positive=2, num_negative=2)
    for hit in result.positives + result.negatives:
        key_q = np.frombuffer(hit.entry.question_embedding, dtype="<f4")
        key_c = np.frombuffer(hit.entry.caption_embedding, dtype="<f4")
        assert hit.sim == pytest.approx(0.8 * float(query_q @ key_q) + 0.2 * float(query_c @ key_c), abs=1e-5)
    assert len(result.positives) == 2 and len(result.negatives) == 1


def test_search_many_equals_one_search_per_query(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    """Batched scoring (one kernel call per bucket) returns what each query alone would, in order,
    across buckets, label counts, captioned and uncaptioned queries of one bucket, and a floor."""
    store = new_store(tmp_path, memory_config(min_similarity=-0.2))
    for i in range(12):
        store.add(make_entry(unit(rng), label="correct" if i % 3 else "incorrect"))
        store.add(make_entry(unit(rng), key_c=unit(rng), label="correct" if i % 2 else "incorrect"))
    text, image, empty = (store.bucket_key("text", None), store.bucket_key("text_image", None),
                          store.bucket_key("text", "time"))
    queries = [SearchQuery(unit(rng), None, text, 2, 2), SearchQuery(unit(rng), unit(rng), image, 3, 1),
               SearchQuery(unit(rng), None, empty, 2, 2), SearchQuery(unit(rng), None, image, 1, 4),
               SearchQuery(unit(rng), None, text, 5, 0), SearchQuery(unit(rng), unit(rng), image, 0, 0)]
    together = store.search_many(queries)
    alone = [store.search(q.query_q, q.query_c, q.bucket, num_positive=q.num_positive, num_negative=q.num_negative)
             for q in queries]
    assert [len(r.positives) + len(r.negatives) for r in alone][:2] != [0, 0]
    for batched, single in zip(together, alone, strict=True):
        assert batched.bucket == single.bucket
        for got, want in ((batched.positives, single.positives), (batched.negatives, single.negatives)):
            assert [h.entry.id for h in got] == [h.entry.id for h in want]
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)
            assert all(h.sim >= -0.2 for h in got)


def test_search_of_an_empty_or_unknown_bucket(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    empty = store.search(unit(rng), None, store.bucket_key("text", "time"), num_positive=2, num_negative=2)
    assert empty.positives == [] and empty.negatives == []
    with pytest.raises(InvalidMemory):
        store.bucket_key("text", "astrology")


def test_delete_and_get(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    ids = [store.add(make_entry(unit(rng))).id for _ in range(5)]
    store.delete(ids[1])  # a middle row: the last row moves into its place
    with pytest.raises(MemoryNotFound):
        store.get(ids[1])
    with pytest.raises(MemoryNotFound):
        store.delete(ids[1])
    hits = store.search(unit(rng), None, store.bucket_key("text", None), num_positive=10, num_negative=0).positives
    assert sorted(hit.entry.id for hit in hits) == sorted(ids[:1] + ids[2:])


def test_invalid_entries_are_refused_before_the_journal(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    store = new_store(tmp_path)
    with pytest.raises(InvalidMemory):
        store.add(make_entry(unit(rng, DIM + 1)))
    with pytest.raises(InvalidMemory):
        store.add(make_entry(unit(rng), category="astrology"))
    assert store.stats().journal_seq == 0


def test_export_import_round_trip_is_identical(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    source = new_store(tmp_path / "a", clock=FakeClock())
    ids = [
        source.add(make_entry(unit(rng), label="incorrect", trajectory="t1", plan="p", category="time")).id,
        source.add(make_entry(unit(rng), key_c=unit(rng), caption="a red bridge", question="where?")).id,
        source.add(make_entry(unit(rng))).id,
    ]
    source.record_outcome(ids[:2], True)
    source.record_outcome(ids[1:], False)
    source.add_meta_plan(MetaPlanPair("m", "q", "good", "bad", question_embedding=vector_to_bytes(unit(rng))))
    exported = b"".join(encode_jsonl(source.export_records()))
    assert exported.count(b"\n") == 4

    target = new_store(tmp_path / "b")
    assert target.import_records(decode_jsonl(exported)) == 4
    assert state_of(target) == state_of(source)
    target.close()
    assert state_of(new_store(tmp_path / "b")) == state_of(source)


def test_import_rejects_a_bad_line_with_its_number(tmp_path: Path) -> None:
    with pytest.raises(InvalidMemory, match="line 2"):
        decode_jsonl(
            b'{"kind": "meta_plan", "id": "a", "question": "q", "successful_plan": "s", "failed_plan": "f"}\n'
            b'{"kind": "entry"}\n'
        )


def _hand_scores(
    store: ExperienceStore, ids: list[str], query: np.ndarray, w: ScoreWeights
) -> dict[str, tuple[float, ...]]:
    """Appendix 10 in numpy: Sim, min-max over the bucket, Val, Freq, Score."""
    entries = [store.get(eid) for eid in ids]
    sims = np.array([float(query @ np.frombuffer(e.question_embedding, dtype="<f4")) for e in entries])
    sim_norm = (sims - sims.min()) / (sims.max() - sims.min() + w.eps)
    result = {}
    for entry, sim, norm in zip(entries, sims, sim_norm):
        value = entry.num_successes / (entry.num_uses + 1)
        freq = 1 / (entry.num_uses + 1)
        result[entry.id] = (w.lambda_sim * norm + w.lambda_value * value + w.lambda_freq * freq, sim, norm, value, freq)
    return result


def test_entry_json_carries_every_field(rng: Generator) -> None:
    entry = make_entry(unit(rng), num_uses=3, num_successes=2, trajectory="t")
    decoded = msgspec.json.decode(msgspec.json.encode(entry))
    assert set(decoded) == {"kind", *entry.__struct_fields__}


def test_the_store_never_passes_max_num_stored(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    """Whatever the clear policy, a write that would pass the hard capacity first clears the lowest-value
    memories (the "cap" rule) down to ``clear_to_fraction``, in the same journaled change."""
    config = memory_config(max_num_stored=10, clear_to_fraction=0.5)
    store = new_store(tmp_path, config)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(10)]
    store.record_outcome(ids[:3], True)  # the valuable ones
    newest = store.add(make_entry(unit(rng), question="one too many")).id
    kept = {r.id for r in store.export_records()}
    assert len(kept) == 5 and newest in kept and set(ids[:3]) <= kept
    with pytest.raises(InvalidMemory, match="max_num_stored"):
        store.import_records([make_entry(unit(rng), question=f"imported {i}") for i in range(11)])
    store.import_records([make_entry(unit(rng), question=f"imported {i}") for i in range(8)])
    assert len(store) <= 10
    before = state_of(store)
    store.close()
    assert state_of(new_store(tmp_path, config)) == before  # the clearing was journaled with the write


def test_meta_plan_memory_never_passes_max_num_stored(new_store: StoreOpener, tmp_path: Path, rng: Generator) -> None:
    """Meta Plan pairs (one per learning question with a success and a failure) have the same hard
    capacity, of their own, cleared oldest first in the writing change, journaled with it."""
    config = memory_config(max_num_stored=10, clear_to_fraction=0.5)
    store = new_store(tmp_path, config)
    for i in range(10):
        store.add_meta_plan(MetaPlanPair(f"p{i}", f"q{i}", "a", "b", question_embedding=vector_to_bytes(unit(rng))))
    store.add(make_entry(unit(rng)))  # workflow memories count apart
    store.add_meta_plan(MetaPlanPair("newest", "q", "a", "b", question_embedding=vector_to_bytes(unit(rng))))
    pairs = {r.id for r in store.export_records() if isinstance(r, MetaPlanPair)}
    assert pairs == {"p6", "p7", "p8", "p9", "newest"} and len(store) == 1
    before = state_of(store)
    store.close()
    assert state_of(new_store(tmp_path, config)) == before


def test_a_caption_reranks_retrieval_as_the_papers_score_says(new_store: StoreOpener, tmp_path: Path,
                                                              rng: Generator) -> None:
    """Sim = 0.8 cos(q) + 0.2 cos(caption), min-max normalised in the bucket, Score = 0.7 Ŝ + 0.3 Val
    + 0.3 Freq (MIA.md), computed here independently of the store: the store's order and scores agree,
    and the caption changes which memory comes first."""
    store = new_store(tmp_path)
    query_q, query_c = unit(rng), unit(rng)
    # "close": the question's twin with an unrelated caption; "pictured": a less similar question whose
    # caption is the query's; the rest are noise with usage history
    close_q = query_q + 0.55 * unit(rng)
    pictured_q = query_q + 0.8 * unit(rng)
    specs = [(close_q / np.linalg.norm(close_q), -query_c, 0), (pictured_q / np.linalg.norm(pictured_q), query_c, 0),
             *((unit(rng), unit(rng), int(rng.integers(0, 6))) for _ in range(6))]
    ids = []
    for key_q, key_c, uses in specs:
        entry = make_entry(key_q, key_c=key_c, caption="c", num_uses=uses, num_successes=int(rng.integers(0, uses + 1)))
        store.add(entry)
        ids.append(entry.id)
    stored = [store.get(i) for i in ids]

    def expected(with_caption: bool) -> list[tuple[str, float]]:
        keys_q = np.stack([np.frombuffer(e.question_embedding, dtype="<f4") for e in stored])
        keys_c = np.stack([np.frombuffer(e.caption_embedding, dtype="<f4") for e in stored])
        sim = 0.8 * keys_q @ query_q + 0.2 * keys_c @ query_c if with_caption else keys_q @ query_q
        norm = (sim - sim.min()) / (sim.max() - sim.min() + 1e-8)
        uses = np.array([e.num_uses for e in stored], dtype=np.float64)
        wins = np.array([e.num_successes for e in stored], dtype=np.float64)
        score = 0.7 * norm + 0.3 * wins / (uses + 1) + 0.3 / (uses + 1)
        return sorted(((e.id, float(s)) for e, s in zip(stored, score)), key=lambda item: -item[1])

    for with_caption in (True, False):
        result = store.search(query_q, query_c if with_caption else None, store.bucket_key("text_image", None),
                              num_positive=len(stored), num_negative=0)
        got = [(hit.entry.id, hit.score) for hit in result.positives]
        want = expected(with_caption)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)
        assert got[0][0] == (ids[1] if with_caption else ids[0])  # the caption moves "pictured" ahead


def test_min_similarity_drops_unrelated_memories_and_meta_plans(new_store: StoreOpener, tmp_path: Path,
                                                                 rng: Generator) -> None:
    query = unit(rng)
    near = query + 0.1 * unit(rng)
    near /= np.linalg.norm(near)
    far = unit(rng) - 0.5 * query  # leans away from the query (the assert below checks both sides of the floor)
    far /= np.linalg.norm(far)
    floor = 0.5
    assert float(query @ near) >= floor > float(query @ far)
    store = new_store(tmp_path, memory_config(min_similarity=floor))
    kept, dropped = make_entry(near, label="correct"), make_entry(far, label="incorrect")
    for entry in (kept, dropped):
        store.add(entry)
    for key, pair_id in ((near, "near"), (far, "far")):
        store.add_meta_plan(MetaPlanPair(pair_id, "q", "a", "b", question_embedding=vector_to_bytes(key)))

    result = store.search(query, None, store.bucket_key("text", None), num_positive=2, num_negative=2)
    assert [hit.entry.id for hit in result.positives] == [kept.id] and result.negatives == []
    assert [hit.pair.id for hit in store.search_meta_plans(query, 2)] == ["near"]

    open_floor = new_store(tmp_path / "paper", memory_config())  # the paper's default: no floor
    for entry in (kept, dropped):
        open_floor.add(entry)
    result = open_floor.search(query, None, open_floor.bucket_key("text", None), num_positive=2, num_negative=2)
    assert len(result.positives) == 1 and len(result.negatives) == 1


@pytest.mark.parametrize("cap", [1, 0])
def test_cpu_scoring_caps_openblas_threads_only_while_it_runs(tmp_path: Path, rng: Generator, cap: int) -> None:
    """``score_cpu_threads``: OpenBLAS's threads are capped inside the score call and restored after it."""
    from threadpoolctl import ThreadpoolController

    from mia_kernels.memory_score import memory_topk

    openblas = ThreadpoolController().select(internal_api="openblas")
    default = max(info["num_threads"] for info in openblas.info())
    if default < 2:
        pytest.skip("one BLAS thread already: a cap could not be told apart")
    seen: list[int] = []

    def recording_score(*args: object, **kwargs: object) -> object:
        seen.append(max(info["num_threads"] for info in ThreadpoolController().select(internal_api="openblas").info()))
        return memory_topk(*args, **kwargs)

    store = ExperienceStore.open(tmp_path, memory_config(score_cpu_threads=cap), DIM, clock=FakeClock(),
                                 score_fn=recording_score)
    try:
        store.add(make_entry(unit(rng)))
        store.search(unit(rng), None, store.bucket_key("text", None), num_positive=1, num_negative=1)
    finally:
        store.close()
    assert seen == [cap or default]
    assert max(info["num_threads"] for info in openblas.info()) == default
