"""``eval --metric judge``: each returned answer graded by an LLM with the paper's judge prompt.

The prompt is ``agent.prompts.GRADER``, the reference's ``JUDGE_PROMPT`` word for word (the grader behind
the paper's accuracies, which the loop's ``LLMGrader`` also uses), sent as the reference sends it
(``agent.judge.build_grader``): its system message, temperature 0, thinking off, the letter read from the
whole reply (A correct, B incorrect, C not attempted; anything else is not attempted, as there). It grades
every mode, the bare model included, whatever judge the loop itself is configured with.

With ``agent.structured_judges`` the reply is constrained to one letter (``verdicts.GRADER_REGEX``), what
the prompt asks for anyway, so a model too small to follow it still yields a grade.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from ..agent.judge import build_grader
from ..agent.llm import complete
from ..agent.loop import NO_ANSWER
from ..agent.verdicts import parse_grade
from ..config import MIAConfig

if TYPE_CHECKING:
    from ..engines.client import EngineClient

Grade = Literal["A", "B", "C"]


def judge_role(config: MIAConfig, name: str) -> str:
    """The role that grades: a loop role's name (``manager``, ``judge``, ... : the role it maps to in
    ``agent.roles``) or a role id of the config; a one-line error naming the choices otherwise."""
    loop_roles = {field: getattr(config.agent.roles, field) for field in config.agent.roles.__struct_fields__}
    if name in loop_roles:
        return loop_roles[name]
    if name in config.roles:
        return name
    raise SystemExit(f"python -m mia_engine: error: --judge-role {name}: not a loop role "
                     f"({', '.join(loop_roles)}) or a role of the config ({', '.join(sorted(config.roles))})")


class PaperJudge:
    """Grades answers against gold with the paper's grader (``agent.judge.build_grader``) on one role."""

    def __init__(self, client: EngineClient, config: MIAConfig, role: str) -> None:
        self.client = client
        self.config = config.agent
        self.role = role

    async def grade(self, question: str, answers: Sequence[str], prediction: str) -> Grade:
        """A / B / C; an empty answer or the loop's "no answer" is C without a call (nothing was attempted)."""
        if not prediction.strip() or prediction.strip() == NO_ANSWER:
            return "C"
        messages, options = build_grader(question, answers, prediction, self.config)
        (text,) = await complete(self.client.role(self.role), messages, options, keep_thinking=False)
        return parse_grade(text) or "C"
