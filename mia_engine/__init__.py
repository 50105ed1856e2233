"""MIA Engine: one-process serving of the Memory Intelligence Agent (Planner, Executor, Manager) on vLLM."""

__version__ = "0.1.0"
