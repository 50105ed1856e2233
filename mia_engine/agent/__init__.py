"""The research loop: ``loop.py: ResearchAgent.research`` runs a question through the paper's stages
(retrieve → plan → route → execute → judge → reward → memory), ``rollout.py: RolloutRunner.run`` one
plan's rollout (execute → answer → reflect → replan).

Where a config departs from the paper, ``strategies.py`` chooses a strategy once (``[agent] profile``
names a set of departures, ``config/agent.py``): what the Planner writes (``plan_forms.py``), what an
Executor turn may be (``turn_policy.py``), where the answer comes from (``answers.py``), how a
workflow memory is written (``workflows.py``), how an answer is graded (``judge.py``). The rest is
pure logic (prompts, parsers, rewards), so each rule of the method is tested without a model.
"""
