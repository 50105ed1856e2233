"""``VectorIndex``: removals leave tombstones that one compaction clears, searches answer exactly as an
index that never held the removed vectors, and the store's clears and journal replays rewrite each
FAISS index once at most instead of once per removed id."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import faiss
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mia_engine.config.memory import DurabilityConfig, MemoryConfig
from mia_engine.memory.entries import MemoryEntry, MetaPlanPair, vector_from_bytes, vector_to_bytes
from mia_engine.memory.index import MAX_NUM_REMOVED_ROWS, VectorIndex, gpu_resources
from mia_engine.memory.store import ExperienceStore

from .factories import DIM, FakeClock, StoreOpener, make_entry, memory_config, unit

SMALL_DIM = 4
# small integer coordinates: exact inner products, and many exact ties between rows
int_vectors = st.lists(st.integers(-1, 1), min_size=SMALL_DIM, max_size=SMALL_DIM).map(
    lambda xs: np.array(xs, dtype=np.float32))
ids = st.integers(0, 59).map(str)
operations = st.lists(st.one_of(
    st.tuples(st.just("add"), ids, int_vectors),  # twice: adds (and overwrites) twice as likely
    st.tuples(st.just("add"), ids, int_vectors),
    st.tuples(st.just("remove"), st.lists(ids, max_size=8)),
    st.tuples(st.just("search"), int_vectors, st.integers(1, 12)),
), max_size=120)


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _fresh(live: dict[str, np.ndarray], dim: int) -> VectorIndex:
    """An index that never held a removed vector: the live ones, added in their insertion order."""
    index = VectorIndex(dim)
    for entry_id, vector in live.items():
        index.add(entry_id, vector)
    return index


def _by_hand(live: dict[str, np.ndarray], query: np.ndarray, k: int) -> list[tuple[str, float]]:
    """Exact top-k of integer vectors: similarity descending, then insertion order."""
    sims = [(float(vector @ query), position, entry_id) for position, (entry_id, vector) in enumerate(live.items())]
    return [(entry_id, sim) for sim, _, entry_id in sorted(sims, key=lambda s: (-s[0], s[1]))[:k]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(0, 6))
def test_search_is_that_of_an_index_that_never_held_the_removed_vectors(ops: list, max_num_removed: int) -> None:
    index = VectorIndex(SMALL_DIM, max_num_removed=max_num_removed)
    live: dict[str, np.ndarray] = {}
    for op in ops:
        if op[0] == "add":
            live.pop(op[1], None)  # an overwrite is a removal, then an insertion at the end
            live[op[1]] = op[2]
            index.add(op[1], op[2])
        elif op[0] == "remove":
            for entry_id in op[1]:
                live.pop(entry_id, None)
            index.remove_many(op[1])
        else:
            found = index.search(op[1], op[2])
            assert found == _fresh(live, SMALL_DIM).search(op[1], op[2]) == _by_hand(live, op[1], op[2])
        assert len(index) == len(live) and index.num_rows <= len(live) + max_num_removed


def test_rows_tied_at_the_kth_place_come_oldest_first() -> None:
    """FAISS picks arbitrarily among rows tied at its last place (its pick depends on k and on the rows
    it holds), so the index asks for more until every tied row is in, then takes the oldest."""
    index = VectorIndex(SMALL_DIM, max_num_removed=10)
    for i in range(300):
        index.add(str(i), np.ones(SMALL_DIM, dtype=np.float32))
    index.remove_many([str(i) for i in range(0, 20, 2)])  # 10 dead rows, not compacted yet
    assert index.num_rows == 300
    query = np.ones(SMALL_DIM, dtype=np.float32)
    assert index.search(query, 3) == [("1", 4.0), ("3", 4.0), ("5", 4.0)]
    assert [hit[0] for hit in index.search(query, 20)] == [*map(str, range(1, 20, 2)), *map(str, range(20, 30))]


def test_float_vectors_keep_bitwise_identical_similarities(rng: np.random.Generator) -> None:
    """Encoder-like 384-d vectors: a row's similarity does not depend on where it sits in FAISS."""
    dim, index = 384, VectorIndex(384, max_num_removed=40)
    live: dict[str, np.ndarray] = {}
    for step in range(600):
        entry_id = str(int(rng.integers(0, 200)))
        if rng.random() < 0.35:
            live.pop(entry_id, None)
            index.remove(entry_id)
        else:
            live.pop(entry_id, None)
            live[entry_id] = unit(rng, dim)
            index.add(entry_id, live[entry_id])
        if step % 50 == 49:
            reference = _fresh(live, dim)
            for k in (1, 8, 33):
                query = unit(rng, dim)
                assert index.search(query, k) == reference.search(query, k)


def test_a_batch_removal_compacts_once(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    passes = _count_index_passes(monkeypatch, remove_ids_works=True)
    index = VectorIndex(DIM)
    for i in range(5000):
        index.add(str(i), unit(rng))
    index.remove_many([str(i) for i in range(2500)])
    assert passes == {"rewrites": 1} and index.num_rows == len(index) == 2500
    for i in range(2500, 4600):  # one by one: a compaction per MAX_NUM_REMOVED_ROWS + 1 removals
        index.remove(str(i))
    assert passes == {"rewrites": 1 + 2100 // (MAX_NUM_REMOVED_ROWS + 1)}
    assert len(index) == 400 and index.num_rows == 400 + 2100 % (MAX_NUM_REMOVED_ROWS + 1)


@pytest.fixture(params=[True, False], ids=["cpu", "gpu-style"])
def index_passes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    """Full passes over FAISS indexes; "gpu-style": ``remove_ids`` raises, as on a GPU flat index."""
    yield _count_index_passes(monkeypatch, remove_ids_works=request.param)


def _count_index_passes(monkeypatch: pytest.MonkeyPatch, *, remove_ids_works: bool) -> Counter:
    """Counts each ``remove_ids`` call (O(n) on a flat index) and each rewrite of an existing
    ``VectorIndex`` into a new FAISS index (its first FAISS index, at construction, is not counted)."""
    passes: Counter = Counter()
    remove_ids, new_index = faiss.IndexIDMap2.remove_ids, VectorIndex._new_index

    def counted_remove_ids(self: faiss.IndexIDMap2, *args: object) -> object:
        passes["remove_ids"] += 1
        if not remove_ids_works:
            raise RuntimeError("remove_ids not implemented for this type of index")
        return remove_ids(self, *args)

    def counted_new_index(self: VectorIndex) -> faiss.IndexIDMap2:
        if hasattr(self, "_index"):
            passes["rewrites"] += 1
        return new_index(self)

    monkeypatch.setattr(faiss.IndexIDMap2, "remove_ids", counted_remove_ids)
    monkeypatch.setattr(VectorIndex, "_new_index", counted_new_index)
    return passes


def _pair(rng: np.random.Generator, i: int) -> MetaPlanPair:
    return MetaPlanPair(f"pair-{i}", f"q{i}", "good", "bad", created_at=float(i),
                        question_embedding=vector_to_bytes(unit(rng)))


def test_a_clear_rewrites_each_index_once_at_most(
    index_passes: Counter, new_store: StoreOpener, tmp_path: Path, rng: np.random.Generator,
) -> None:
    """4,000 memories in one bucket (two label indexes) and 1,500 Meta Plan pairs (one index); the clear
    keeps 400 and 100: 1,800 removals per label index and 1,400 pairs, one compaction each."""
    config = memory_config(clear_policy="cap", max_num_entries=400, max_num_meta_plans=100)
    store = new_store(tmp_path, config)
    entries = [make_entry(unit(rng), label=("correct", "incorrect")[i % 2]) for i in range(4000)]
    store.import_records([*entries, *(_pair(rng, i) for i in range(1500))])
    index_passes.clear()
    cleared = store.clear_after_update()
    assert (len(cleared.removed_ids), len(cleared.removed_meta_plan_ids)) == (3600, 1400)
    assert sum(index_passes.values()) <= 3, index_passes  # one per index, not one per removed id
    # the dead rows are invisible: a kept memory is still found as a duplicate, a removed one is not
    removed = set(cleared.removed_ids)
    kept = next(e for e in entries if e.is_correct and e.id not in removed)
    gone = next(e for e in entries if e.is_correct and e.id in removed)
    assert store.add(_same_question(kept, summary=kept.workflow_summary + " and more")).action == "kept_existing"
    assert store.add(_same_question(gone)).action == "inserted"
    hits = store.search_meta_plans(unit(rng), 200)
    assert sorted(hit.pair.id for hit in hits) == sorted(f"pair-{i}" for i in range(1400, 1500))


def test_after_a_clear_the_store_answers_as_one_that_never_held_the_removed_memories(
    new_store: StoreOpener, tmp_path: Path, rng: np.random.Generator,
) -> None:
    """A clear small enough to leave its removed rows in FAISS (no compaction) and holes in the score
    matrices: retrieval, duplicate lookup and Meta Plan search see exactly the survivors."""
    config = memory_config(clear_policy="cap", max_num_entries=120, max_num_meta_plans=30)
    store = new_store(tmp_path / "cleared", config)
    entries = [make_entry(unit(rng), label=("correct", "incorrect")[i % 3 == 0], num_uses=int(u), num_successes=int(s))
               for i, (u, s) in enumerate(zip(rng.integers(3, 6, 300), rng.integers(0, 3, 300)))]
    store.import_records([*entries, *(_pair(rng, i) for i in range(80))])
    cleared = store.clear_after_update()
    assert (len(cleared.removed_ids), len(cleared.removed_meta_plan_ids)) == (180, 50)
    fresh = new_store(tmp_path / "fresh", config)
    fresh.import_records(store.export_records())
    bucket = store.bucket_key("text", None)
    for _ in range(20):
        query = unit(rng)
        assert store.search(query, None, bucket, num_positive=6, num_negative=6) == fresh.search(
            query, None, bucket, num_positive=6, num_negative=6)
        assert store.search_meta_plans(query, 7) == fresh.search_meta_plans(query, 7)
    for entry in entries[:40]:  # a survivor's twin is a duplicate in both stores, a removed one's in neither
        twin = _same_question(entry, summary="x")
        assert store.add(twin).action == fresh.add(msgspec.structs.replace(twin, id=twin.id + "-b")).action


def _same_question(entry: MemoryEntry, **fields: object) -> MemoryEntry:
    return make_entry(vector_from_bytes(entry.question_embedding, DIM), label=entry.label, **fields)


def test_journal_replay_of_many_deletes_rewrites_each_index_once_at_most(
    index_passes: Counter, tmp_path: Path, rng: np.random.Generator,
) -> None:
    """2,000 memories, then 1,200 deletes of one id each (1,200 journal changes), replayed on open."""
    config = MemoryConfig(durability=DurabilityConfig(fsync="never", snapshot_interval=100_000))
    store = ExperienceStore.open(tmp_path, config, DIM, clock=FakeClock())
    entries = [make_entry(unit(rng)) for _ in range(2000)]
    store.import_records(entries)
    for entry in entries[:1200]:
        store.delete(entry.id)
    store.close()
    index_passes.clear()
    reopened = ExperienceStore.open(tmp_path, config, DIM, clock=FakeClock())
    try:
        assert len(reopened) == 800
        assert sum(index_passes.values()) <= 1 + 1200 // (MAX_NUM_REMOVED_ROWS + 1), index_passes
        assert reopened.add(_same_question(entries[1500], summary="x")).action == "replaced"  # shorter wins
        assert reopened.add(_same_question(entries[0])).action == "inserted"  # deleted: no duplicate left
    finally:
        reopened.close()


@pytest.mark.gpu
@pytest.mark.skipif(getattr(faiss, "get_num_gpus", lambda: 0)() == 0, reason="needs FAISS built with CUDA and a GPU")
def test_gpu_index_answers_as_the_cpu_index(rng: np.random.Generator) -> None:
    gpu, cpu = VectorIndex(384, gpu_resources("cuda:0"), max_num_removed=50), VectorIndex(384, max_num_removed=50)
    for _ in range(400):
        entry_id = str(int(rng.integers(0, 150)))
        if rng.random() < 0.35:
            gpu.remove(entry_id)
            cpu.remove(entry_id)
        else:
            vector = unit(rng, 384)
            gpu.add(entry_id, vector)
            cpu.add(entry_id, vector)
        query = unit(rng, 384)
        assert [hit[0] for hit in gpu.search(query, 8)] == [hit[0] for hit in cpu.search(query, 8)]
