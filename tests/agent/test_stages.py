"""Stage timing: the observer sees every stage start and finish, the request's timings add up."""

from __future__ import annotations

import pytest

from mia_engine.agent.loop import ResearchRequest
from mia_engine.agent.stages import STAGES, StageTimer

from .test_loop import ANSWER, CALL, agent_with, role_script


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.in_flight: dict[str, int] = {}

    def stage_started(self, stage: str) -> None:
        self.events.append(("start", stage))
        self.in_flight[stage] = self.in_flight.get(stage, 0) + 1

    def stage_finished(self, stage: str, seconds: float) -> None:
        assert seconds >= 0
        self.events.append(("finish", stage))
        self.in_flight[stage] -= 1


def test_a_stage_that_raises_still_finishes_and_is_timed() -> None:
    recorder, timings = Recorder(), {}
    timer = StageTimer(recorder).for_request(timings)
    with pytest.raises(RuntimeError), timer("plan"):
        raise RuntimeError("boom")
    with timer("plan"):
        pass
    assert recorder.events == [("start", "plan"), ("finish", "plan")] * 2
    assert recorder.in_flight == {"plan": 0} and timings["plan"] >= 0


async def test_the_loop_reports_each_stage_and_step_to_the_observer() -> None:
    agent, _, _ = agent_with(role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL,
                                         reflection="yes"))
    recorder = Recorder()
    agent.stages.observer = recorder
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True))
    seen = [stage for kind, stage in recorder.events if kind == "finish"]
    assert set(seen) >= {"retrieve", "plan", "route", "execute", "execute_turn", "tool_call", "reflect", "replan",
                         "judge", "consolidate"}
    assert set(seen) <= set(STAGES)
    assert all(n == 0 for n in recorder.in_flight.values())
    trajectory = result.rollouts[0].trajectory
    assert seen.count("execute_turn") == len(trajectory.turns) >= 2
    assert seen.count("tool_call") == trajectory.num_tool_calls >= 1
    assert set(result.timings) <= set(STAGES)
