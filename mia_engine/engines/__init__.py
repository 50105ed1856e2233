"""Engines (one vLLM ``AsyncLLM`` per base model) and the roles served on them."""
