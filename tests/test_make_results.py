"""bench/RESULTS.md is generated from the result files (bench/make_results.py), and every result file
records where it comes from (bench/results_io.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench import make_results, results_io
from bench.results_io import Result, provenance


def _write(folder: Path, name: str, result: Result, **fields: object) -> None:
    result.write(folder / name, echo=False, **fields)


def test_the_committed_page_is_what_the_result_files_give() -> None:
    assert make_results.main(["--check"]) == 0


def test_the_committed_page_is_at_most_300_lines() -> None:
    assert len(make_results.PAGE.read_text().splitlines()) <= make_results.MAX_LINES == 300


def test_a_result_file_records_commit_machine_versions_command_and_load() -> None:
    result = Result("probe", argv=["bench/probe.py", "--rounds", "3"])
    result.add_run(round=0, seconds=1.0)
    meta = provenance(result.document(summary={"x": 1}))
    assert meta is not None and meta["benchmark"] == "probe"
    assert len(meta["commit"] or "") == 40 and isinstance(meta["dirty"], bool)
    assert meta["machine"]["cores"] and meta["machine"]["memory_gib"] > 0
    assert {"python", "torch", "vllm", "triton", "mia_engine", "transformers"} <= set(meta["versions"])
    assert meta["command"] == "python bench/probe.py --rounds 3"
    assert meta["started_utc"] and meta["finished_utc"] and len(meta["loadavg"]["start"]) == 3
    assert provenance({"summary": {}}) is None  # a file from before the convention


def test_the_generator_reports_the_median_and_min_max_of_every_run(tmp_path: Path) -> None:
    results = tmp_path / "results"
    synthetic = Result("synthetic", argv=["bench/synthetic.py"])
    for index, seconds in enumerate([1.0, 10.0, 2.0, 3.0]):  # the slowest run counts too
        synthetic.add_run(system="ours", round=index, seconds=seconds)
    _write(results, "synthetic.json", synthetic)
    (results / "old.json").write_text(json.dumps({"summary": {"x": 1}}))

    page = make_results.render(results)

    assert "system = ours | seconds 2.5 (1–10, n = 4)" in page
    assert "[`synthetic.json`](results/synthetic.json)" in page and "python bench/synthetic.py" in page
    assert "1 more result files" in page  # old.json: not shown, counted


def test_the_research_headline_pairs_rounds_and_names_the_settings_that_differ(tmp_path: Path) -> None:
    results = tmp_path / "results"
    research = Result("research", argv=["bench/bench_research.py", "--systems", "peer"])
    for index, (ours, peer) in enumerate([(4.0, 2.0), (3.0, 2.0), (4.4, 2.0)]):
        for learn in (False, True):
            research.add_run(system="ours", learn=learn, round=index, questions_per_s=ours,
                             prompt_tokens_per_question=900.0, cpu_s_per_question=0.25)
            research.add_run(system="peer", learn=learn, round=index, questions_per_s=peer,
                             prompt_tokens_per_question=950.0, cpu_s_per_question=0.5)
    _write(results, "research.json", research,
           args={"systems": ["peer"], "peer_cpu_lora_ops": "same", "peer_cpu_async_scheduling": "vllm"})

    page = make_results.render(results)

    assert "learning off **2×** (1.5–2.2, n = 3)" in page
    assert "async scheduling: off" in page and "LoRA ops: vLLM's own" not in page
    assert "| peer | off | 2 (2–2, n = 3) | prompt tok 950, CPU s 0.5 |" in page  # the cost per question


def test_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    page = tmp_path / "RESULTS.md"
    assert make_results.main(["--results", str(results), "--out", str(page)]) == 0
    assert make_results.main(["--check", "--results", str(results), "--out", str(page)]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert make_results.main(["--check", "--results", str(results), "--out", str(page)]) == 1


def test_the_test_suite_does_not_collect_the_micro_benchmarks() -> None:
    """``python -m pytest`` from the root runs tests/ only; bench/micro runs with ``--benchmark-only``."""
    import tomllib

    pyproject = tomllib.loads((make_results.BENCH.parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    assert (make_results.BENCH / "micro" / "conftest.py").exists()


def test_an_evals_test_time_learning_shows_each_pass_over_the_seeds_and_the_versions_published(tmp_path: Path) -> None:
    results = tmp_path / "results"
    learning = {"mode": "ttl_supervised", "epoch": 1, "is_learning": True, "split": "longtail"}
    unseen = {"mode": "ttl_supervised", "epoch": 1, "is_learning": False, "split": "popular"}
    _write(results, "ttl_eval.json", Result("eval", argv=["python", "-m", "mia_engine", "eval", "--seeds", "2"]),
           modes=["mia_g1", "ttl_supervised"], seeds=2, ttl_rollouts=4,
           summary={"ttl_supervised/1 explore": {**learning, "match": {"per_seed": [0.6, 0.4]}},
                    "ttl_supervised/1 @popular": {**unseen, "match": {"per_seed": [0.25, 0.35]}}},
           passes={"ttl_supervised": [{**learning, "seed": 0, "num_updates": 2}, {**unseen, "seed": 0}]},
           other_passes=[{**unseen, "seed": 1}, {**learning, "seed": 1, "num_updates": 1}])

    page = make_results.render(results)

    assert ("epoch 1: explore 0.5 (0.4–0.6, n = 2) (versions published per seed: 2 / 1), popular 0.3 (0.25–0.35, "
            "n = 2).") in page
    assert "python -m mia_engine eval --seeds 2" in page and "## Other benchmarks" not in page


def test_result_files_written_by_earlier_runs_do_not_mark_a_tree_changed(tmp_path: Path, monkeypatch) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "probe.py").write_text("print(1)\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "probe")
    monkeypatch.setattr(results_io, "REPO", tmp_path)
    monkeypatch.setattr(results_io, "RESULTS", tmp_path / "bench" / "results")
    (tmp_path / "bench" / "results" / "quality_run1.json").write_text("{}")
    assert results_io.git_state()["dirty"] is False
    (tmp_path / "bench" / "probe.py").write_text("print(2)\n")
    state = results_io.git_state()
    assert state["dirty"] is True and state["dirty_files"] == 1  # a changed script still counts
