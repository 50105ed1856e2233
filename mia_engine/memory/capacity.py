"""The store's capacity rule: a change that would leave more than ``memory.max_num_stored`` memories (or
Meta Plan pairs) also clears the lowest-value memories (the oldest pairs) down to ``clear_to_fraction``."""

from __future__ import annotations

import logging

import msgspec

from ..config.memory import MemoryConfig
from .consolidation import entries_to_clear
from .contents import StoreContents
from .entries import InvalidMemory
from .journal import Change

logger = logging.getLogger(__name__)


def with_room(change: Change, contents: StoreContents, config: MemoryConfig) -> Change:
    """``change`` plus the clearing that keeps the store within ``max_num_stored`` once it is applied."""
    return _with_room_for_pairs(_with_room_for_entries(change, contents, config), contents, config)


def _with_room_for_pairs(change: Change, contents: StoreContents, config: MemoryConfig) -> Change:
    """The same capacity for Meta Plan pairs, oldest dropped first (one pair per learning question
    with a success and a failure: unbounded, they grow a long-running server's memory for ever)."""
    capacity, meta_plans = config.max_num_stored, contents.meta_plans
    new_ids = {p.id for p in change.put_meta_plans if p.id not in meta_plans}
    num_deleted = sum(1 for pair_id in set(change.delete_meta_plans) if pair_id in meta_plans)
    if len(meta_plans) - num_deleted + len(new_ids) <= capacity:
        return change
    if len(new_ids) > capacity:
        raise InvalidMemory(f"this change adds {len(new_ids)} Meta Plan pairs; the store keeps at most "
                            f"{capacity} (memory.max_num_stored)")
    keep = max(1, int(capacity * config.clear_to_fraction) - len(new_ids))
    protected = {p.id for p in change.put_meta_plans} | set(change.delete_meta_plans)
    removed = [pair_id for pair_id in meta_plans.oldest_beyond(keep) if pair_id not in protected]
    logger.info("Meta Plan Memory at its capacity (%d): clearing the %d oldest pairs", capacity, len(removed))
    return msgspec.structs.replace(change, delete_meta_plans=[*change.delete_meta_plans, *removed])


def _with_room_for_entries(change: Change, contents: StoreContents, config: MemoryConfig) -> Change:
    entries = contents.entries
    new_ids = {e.id for e in change.put_entries if e.id not in entries}
    num_deleted = sum(1 for entry_id in set(change.delete_entries) if entry_id in entries)
    num_after = len(entries) - num_deleted + len(new_ids)
    if num_after <= config.max_num_stored:
        return change
    if len(new_ids) > config.max_num_stored:
        raise InvalidMemory(f"this change adds {len(new_ids)} memories; the store keeps at most "
                            f"{config.max_num_stored} (memory.max_num_stored)")
    protected = {e.id for e in change.put_entries} | set(change.delete_entries)
    candidates = [e for e in entries.values() if e.id not in protected]
    keep = max(0, int(config.max_num_stored * config.clear_to_fraction) - len(new_ids))
    removed = entries_to_clear(candidates, "cap", max_num_entries=keep, last_clear_at=None)
    logger.info("memory store at its capacity (%d): clearing %d lowest-value memories",
                config.max_num_stored, len(removed))
    return msgspec.structs.replace(change, delete_entries=[*change.delete_entries, *removed])
