"""The command line as a user meets it: ``--version``, ``config show``, every subcommand's ``--help``."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

import mia_engine
from mia_engine.base.config_docs import field_docs
from mia_engine.config import MIAConfig, ServerConfig

COMMANDS = ("serve", "run", "ttl", "init-adapter", "doctor", "eval", "index", "config", "config show", "keys",
            "keys add")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mia_engine", *args], capture_output=True, text=True, timeout=120)


def test_version() -> None:
    for args in (("--version",), ("serve", "--version")):
        out = _run(*args)
        assert out.returncode == 0 and out.stdout.strip().endswith(mia_engine.__version__), out


def test_config_show_prints_the_effective_config_with_docs_and_defaults() -> None:
    out = _run("config", "show", "--config", "tiny", "--server.port=8123", "--server.api_key=secret")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "# TCP port to bind.\n# default: 8000\nport = 8123\n" in text  # the doc, the default, the value
    assert "secret" not in text and 'api_key = "***"' in text
    loaded = tomllib.loads(text)  # it loads back
    assert loaded["server"]["port"] == 8123 and loaded["engines"]["tiny"]["model"] == "embedded:tiny"


def test_config_reference_documents_every_server_field() -> None:
    out = _run("config", "show", "--markdown")
    assert out.returncode == 0, out.stderr
    tables = {"limits", "admission", "images", "connections"}  # sections of their own: [server.limits], ...
    for name in set(ServerConfig.__struct_fields__) - tables:
        assert f"| `{name}` |" in out.stdout
    for table in tables:
        assert f"## `[server.{table}]`" in out.stdout
    assert "``" not in out.stdout
    assert set(field_docs(ServerConfig)) >= set(ServerConfig.__struct_fields__) - tables
    assert field_docs(MIAConfig)["data_dir"].startswith("Durable state")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_help_describes_it_without_markup(command: str) -> None:
    out = _run(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    description = out.stdout.split("\n\n")[1]
    assert len(description) > 20 and not description.startswith(("options:", "positional")), out.stdout
    assert "``" not in out.stdout and ":class:" not in out.stdout


def test_log_flags_set_the_server_fields() -> None:
    from mia_engine.cli import parse_config

    _, config = parse_config(["serve", "--config", "tiny", "--log-level", "warning", "--log-format", "json"])
    assert (config.server.log_level, config.server.log_format) == ("warning", "json")


def test_the_bundled_config_reference_is_current() -> None:
    """docs/CONFIG.md is what ``config show --markdown`` prints today (regenerate it when a field changes)."""
    from pathlib import Path

    out = _run("config", "show", "--markdown")
    reference = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"
    assert out.stdout == reference.read_text(), "docs/CONFIG.md is stale: python -m mia_engine config show --markdown > docs/CONFIG.md"
