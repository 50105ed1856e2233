"""The Executor's tools: local passage search (FAISS), web search, image-to-image search, and the
registry that dispatches a parsed tool call to them."""


class ToolUnavailable(RuntimeError):
    """A tool that is not configured (or whose backing data is missing) was called; the message
    says which setting turns it on, and reaches the Executor as a failed observation."""
