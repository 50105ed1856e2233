"""The bound on the serving (or eval) process's own oneDNN primitive caches: set before its first op."""

from __future__ import annotations

import os

import pytest

import mia_engine.index
from mia_engine.cli import main
from mia_engine.base.onednn import IDEEP_CACHE_ENV, ONEDNN_CACHE_ENV, onednn_cache_env


def test_a_command_runs_with_its_process_caches_bounded_by_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ONEDNN_CACHE_ENV, IDEEP_CACHE_ENV):
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever main() sets
    seen: dict[str, str | None] = {}

    def build(config) -> str:  # stands in for the index build: what the command's work would see
        seen.update({name: os.environ.get(name) for name in (ONEDNN_CACHE_ENV, IDEEP_CACHE_ENV)})
        return "built"

    monkeypatch.setattr(mia_engine.index, "build", build)
    assert main(["index", "--config", "tiny", "--cpu.onednn_cache_capacity=7"]) == 0
    assert seen == {ONEDNN_CACHE_ENV: "7", IDEEP_CACHE_ENV: "7"}


def test_no_cache_keeps_one_ideep_entry() -> None:
    """torch's bf16 matmul crashes with ideep's cache at 0 (seen: SIGSEGV in bench/onednn_cache.py)."""
    assert onednn_cache_env(0) == {ONEDNN_CACHE_ENV: "0", IDEEP_CACHE_ENV: "1"}
    assert onednn_cache_env(64) == {ONEDNN_CACHE_ENV: "64", IDEEP_CACHE_ENV: "64"}
