"""MemoryConfig validation: bad values fail at load time with the field in the message."""

from __future__ import annotations

import msgspec
import pytest

from mia_engine.config.memory import MemoryConfig


def test_defaults_follow_the_paper_and_reference() -> None:
    config = MemoryConfig()
    assert (config.num_positive, config.num_negative, config.replace_threshold) == (2, 2, 0.9999)
    assert len(config.categories) == 10 and config.default_category == "others"
    assert config.durability.fsync == "always" and config.clear_policy == "none"
    assert config.embedder.model_dir == ""
    assert config.min_similarity == -1.0  # no floor: every hit's cosine passes


def test_toml_like_dict_converts() -> None:
    config = msgspec.convert(
        {"categories": ["a", "b"], "default_category": "b", "clear_policy": "cap", "durability": {"fsync": "never"}},
        MemoryConfig,
    )
    assert config.categories == ("a", "b") and config.durability.fsync == "never"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"default_category": "nope"}, "default_category"),
        ({"replace_threshold": 0}, "replace_threshold"),
        ({"clear_policy": "sometimes"}, "clear_policy"),
        ({"durability": {"snapshot_interval": 0}}, "snapshot_interval"),
        ({"embedder": {"batch_size": 0}}, "batch_size"),
        ({"min_similarity": 1.5}, "min_similarity"),
        ({"search_batch_size": 0}, "search_batch_size"),
        ({"score_cpu_threads": -1}, "score_cpu_threads"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_invalid_values_are_refused(raw: dict, needle: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=needle):
        msgspec.convert(raw, MemoryConfig)
