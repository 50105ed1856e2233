"""One owner per checkpoint root: a second instance on the same data dir (a second server started on it, refused
later when it opens the memory store) leaves the first one's unfinished checkpoint alone."""

from __future__ import annotations

from pathlib import Path

from mia_engine.learner.checkpoints import AdapterCheckpoints


def test_a_second_instance_never_deletes_the_first_ones_checkpoint_in_progress(tmp_path: Path) -> None:
    first = AdapterCheckpoints(tmp_path / "adapters" / "planner", keep=2)
    writing = first.root / ".tmp-0123456789abcdef0123456789abcdef"  # as ``save`` makes it, mid-copy
    writing.mkdir()
    (writing / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    second = AdapterCheckpoints(first.root, keep=2)
    assert writing.is_dir() and (writing / "adapter_model.safetensors").exists()
    second.close()
    first.close()
    AdapterCheckpoints(first.root, keep=2).close()  # the root's owner now: what a crash left is removed
    assert not writing.exists()
