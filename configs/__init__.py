"""Bundled configurations, found by name: ``--config default`` reads ``default.toml`` here."""
