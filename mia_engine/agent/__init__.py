"""The research loop's parts: config, prompts, typed messages and parsers, rewards and judges.

Pure logic (everything here but ``llm.complete`` is synchronous and engine-free), so each rule of
the method can be tested without a model; the orchestration loop composes these parts.
"""
