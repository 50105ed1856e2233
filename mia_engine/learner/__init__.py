"""Test-time learning of the Planner (MIA step 7, "parametric memory"): GRPO updates of its LoRA adapter.

``grpo`` holds the objective (pure torch), ``batching`` the judged rollouts (``GRPOSample``) and the
padded micro-batches built from them, ``grammar_mask`` the structured-output mask each regex-written
Planner token was sampled under (replayed with xgrammar, as vLLM built it), ``model`` loads the PEFT
model for training and splits it into decoder and output embedding, ``learner`` takes one GRPO step per batch of judged rollouts with it and
writes each accepted version as a PEFT folder that vLLM loads, ``checkpoints`` the durable copies of
published versions used for rollback. Nothing here imports vLLM: the learner runs in the server's
process (or on its own GPU) and hands adapters over as folders.
"""
