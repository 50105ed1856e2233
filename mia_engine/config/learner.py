"""Configuration of the test-time learner (one frozen struct, ``[learner]`` in the root config).

The defaults are the paper's test-time update (MIA algorithm 3, step 7): GRPO with the clipped ratio
objective, token-level mean over the Planner's own tokens, no KL term, one epoch; the learning rate is a
LoRA's (the paper's 1e-6 is the reference's full fine-tuning rate).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from ..base.structs import Frozen, require

Aggregation = Literal["grpo", "dapo"]
LearnerDtype = Literal["float32", "bfloat16", "float16"]
LearnerProcessKind = Literal["spawn", "thread"]


class LearnerConfig(Frozen):
    """How the Planner's LoRA adapter is updated between batches of judged rollouts."""

    num_threads: int = 1
    """Torch intra-op threads of the serving process once the learner is loaded, and of the learner's own
    process (0 = leave torch's default). One by default because on a CPU box the learner shares cores with the vLLM worker, and one
    thread keeps chat latency under updates steadier and the step faster there. It applies to threads that start torch work after the learner loads; the sentence
    encoder's thread, loaded and warmed before, keeps the process default (the passage index builds at
    full speed)."""
    batch_size: int = 32
    """Questions (rollout groups of G) gathered per GRPO update of online test-time learning (paper: 32)."""
    max_queued_updates: int = 2
    """Updates waiting or running at most. A full batch that finds this many waits for one to finish
    (backpressure on the learning requests, as the reference's batch t+1 waits for t's update) instead of
    piling up batches of samples in memory."""
    max_sample_staleness: int = 4
    """How many Planner adapter versions behind the one serving a rollout may have been sampled and still
    be trained on; older ones are left out of the update (logged, and counted in
    ``StepResult.num_skipped_stale``). The clipped ratio corrects a policy a few updates behind the
    learner (the old log-probs are the sampler's), not one many updates back, whose tokens the clip would
    mostly silence. 4 (AReaL's default bound, Fu et al. 2025) covers the batches an update queue keeps
    (``max_queued_updates``) plus the questions answered meanwhile at a few in flight; 0 = strictly
    on-policy (only rollouts of the version serving now)."""
    process: LearnerProcessKind = "spawn"
    """Where the learner runs: "spawn" = a child process of its own (started with multiprocessing's
    spawn; on a GPU its own CUDA context on ``device``), "thread" = a thread of the serving process. Spawn
    by default: a separate interpreter and CUDA context keep the learner's steps off the GIL and the
    GPU stream that the memory searches a question waits for; a child that dies is restarted
    (``max_restarts``) while serving goes on."""
    max_restarts: int = 3
    """How many times a learner process that died (killed, out of memory) is replaced by a fresh one on
    the version served before test-time learning is off (``/health`` says so; serving goes on); a few
    survive a one-off kill without retrying for ever a batch that always kills it."""
    device: str = "cpu"
    """Torch device of the learner's copy of the Planner ("cpu", "cuda", "cuda:7"); on a multi-GPU node
    give it a GPU of its own so training never slows the serving engines."""
    dtype: LearnerDtype = "float32"
    """Dtype of the base weights in the learner (bfloat16 on a GPU); LoRA weights stay float32 (PEFT
    upcasts them; the optimizer updates them) and are published in the serving engine's dtype. Below
    float32 the forward runs under autocast to this dtype, LoRA matmuls included; log-probs are float32."""
    lr: float = 1e-4
    """AdamW learning rate of the LoRA weights. The reference's 1e-6 is a full fine-tuning rate: on a LoRA
    it moves the policy by nothing measurable. 1e-4 is the order LoRA is trained at (Hu et al. 2021:
    2e-4), picked from a measured curve of learning rates on the embedded default's dev split (the KL
    between consecutive Planner versions, the reward, the drift from the sampling engine;
    ``bench/bench_lr_curve.py``): the policy moves at it, and ten times more overshoots."""
    clip_eps: float = 0.2
    """PPO clip range ε: the ratio is clipped to [1 − ε, 1 + ε_high]."""
    clip_eps_high: float | None = None
    """Upper clip range ε_high (DAPO's "clip higher"); None = ``clip_eps``."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy = the same model with the adapter disabled
    (paper: 0, which also skips the reference forward pass)."""
    aggregation: Aggregation = "grpo"
    """"grpo": mean over sequences of each sequence's token mean (paper Eq. 3); "dapo": sum over all active
    tokens / number of active tokens (long completions weigh more)."""
    temperature: float = 1.0
    """Logits are divided by it before the log-softmax; must be the Planner's sampling temperature, or
    the log-probs are those of a different policy than the one that sampled."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 = no clipping (the norm is still measured and checked)."""
    micro_batch_size: int = 4
    """Sequences per forward/backward pass; gradients are accumulated and scaled so the result equals the
    full-batch gradient. Lower it when the learner runs out of memory."""
    logit_chunk_size: int = 1024
    """Positions (tokens, over the whole micro-batch) whose vocabulary logits exist at once when the
    learner scores log-probs, forward and backward; the full (positions x vocabulary) logits never do.
    A chunk costs this x vocabulary x at most ~15 bytes: 1024 positions of a 151,936-entry vocabulary
    are 0.58 GiB of float32 logits and at most ~2.2 GiB at the chunk's peak, while matmuls of 1024 rows
    still keep a GPU busy."""
    max_seq_len: int = 0
    """Longest prompt + completion (tokens) the learner trains on; longer rollouts are left out of the
    update (counted in ``StepResult.num_skipped_long``). 0 = no limit beyond the Planner engine's
    ``max_model_len``, which is then what the dry run budgets: ``micro_batch_size`` sequences of it."""
    gradient_checkpointing: bool = True
    """Recompute decoder layers' activations in the backward pass instead of keeping them (an 8B learner
    does not fit one GPU without it at long contexts); which layers: ``checkpoint_layers``. Needs train
    mode, which the learner uses (with dropout off) because Hugging Face turns checkpointing off under
    ``eval()``."""
    checkpoint_layers: int = -1
    """With ``gradient_checkpointing``, how many decoder layers (the first ones) recompute their
    activations in the backward; the others keep them and skip that second forward. -1 = chosen per
    micro-batch on a GPU: the fewest that let the others' activations (measured per token when the
    learner loads) fit the device's free memory less ``checkpoint_headroom_gib``; on a CPU, whose memory
    the learner shares with the engines, all of them."""
    checkpoint_headroom_gib: float = 4.0
    """GPU memory (GiB) that ``checkpoint_layers = -1`` leaves free beyond its estimate of a micro-batch's
    peak, for the device's other users (the sentence encoder's batches, growing memory score matrices)
    and the allocator's fragmentation. What a step reserves stays in torch's cache after it."""
    min_model_flops_utilization: float = 0.0
    """Floor of the doctor's GRPO-step check on a GPU: the step's model-FLOPs utilisation (the FLOPs a
    LoRA step requires, without recompute, over the time and the GPU's bf16 dense peak:
    ``doctor/flops.py``) as a fraction; below it the check fails. 0 = no floor."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay of the LoRA weights."""
    num_epochs: int = 1
    """Optimizer steps over the same batch (paper: 1). Beyond the first, the ratio to the sampling policy
    moves away from 1 and clipping matters."""
    advantage_eps: float = 1e-6
    """ε in the group advantage (R − mean) / (std + ε)."""
    publish_dir: str = ""
    """Where adapter versions are written for vLLM to load; empty = ``<data_dir>/adapters/published``
    (private to this instance), or a folder on ``publish_tmpfs``."""
    publish_tmpfs: str = ""
    """A tmpfs (e.g. ``/dev/shm``) to publish on instead of the data dir, so the update path writes no
    disk; used only when it has room for ``num_checkpoints_kept`` + 2 adapters, in a folder of this
    instance's own (mode 0700, named after the data dir). A default Docker /dev/shm is 64 MB: a rank-64
    adapter of an 8B model is ~0.35 GB in bf16. Ignored when ``publish_dir`` is set."""
    shared_dirs: list[str] = []
    """Absolute paths of folders that every node of the Ray cluster mounts at the same path (an NFS
    export, say); empty = none. Needed only when the Planner's engine has ``executor_backend = "ray"``:
    its workers on other nodes load every adapter version by path, so the folders the learner writes
    on this machine, ``publish_dir`` and the checkpoints under ``<data_dir>/adapters/<planner role>``
    (served again at restart and rollback), must lie under one of these (a link counts where it
    points); loading refuses the config otherwise, and a ``publish_tmpfs`` never qualifies (a tmpfs is
    private to its node). Static folders, the model and a role's configured ``adapter``, are the
    operator's to copy to every node, as for any vLLM engine on Ray (docs/DEPLOY_8GPU.md, "Past one box")."""
    num_reports_kept: int = 1024
    """Latest update reports the learner keeps in memory (``TestTimeLearner.reports``); older ones are
    dropped, so a server that learns for days does not grow with its update count."""
    num_checkpoints_kept: int = 3
    """Durable copies of published versions kept for rollback (the latest good one is never pruned)."""
    seed: int = 0
    """Seed of torch's RNG, set when the learner is built (the step itself uses no randomness)."""

    def __post_init__(self) -> None:
        require(bool(self.device.strip()), "learner.device must not be empty")
        require(self.batch_size >= 1, f"learner.batch_size must be >= 1, got {self.batch_size}")
        require(self.max_queued_updates >= 1, f"learner.max_queued_updates must be >= 1, got {self.max_queued_updates}")
        require(self.max_sample_staleness >= 0,
                f"learner.max_sample_staleness must be >= 0, got {self.max_sample_staleness}")
        require(self.num_threads >= 0, f"learner.num_threads must be >= 0, got {self.num_threads}")
        require(self.max_restarts >= 0, f"learner.max_restarts must be >= 0, got {self.max_restarts}")
        require(math.isfinite(self.lr) and self.lr > 0, f"learner.lr must be a positive number, got {self.lr}")
        require(0 < self.clip_eps < 1, f"learner.clip_eps must be in (0, 1), got {self.clip_eps}")
        require(self.clip_eps_high is None or 0 < self.clip_eps_high < math.inf,
                 f"learner.clip_eps_high must be > 0 (or unset), got {self.clip_eps_high}")
        require(math.isfinite(self.kl_beta) and self.kl_beta >= 0, f"learner.kl_beta must be >= 0, got {self.kl_beta}")
        require(math.isfinite(self.temperature) and self.temperature > 0,
                 f"learner.temperature must be > 0, got {self.temperature}")
        require(math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0,
                 f"learner.max_grad_norm must be >= 0 (0 = no clipping), got {self.max_grad_norm}")
        require(self.micro_batch_size >= 1, f"learner.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0,
                 f"learner.weight_decay must be >= 0, got {self.weight_decay}")
        require(self.logit_chunk_size >= 1, f"learner.logit_chunk_size must be >= 1, got {self.logit_chunk_size}")
        require(self.max_seq_len >= 0, f"learner.max_seq_len must be >= 0, got {self.max_seq_len}")
        require(self.checkpoint_layers >= -1,
                f"learner.checkpoint_layers must be >= 0 (or -1: chosen by memory), got {self.checkpoint_layers}")
        require(math.isfinite(self.checkpoint_headroom_gib) and self.checkpoint_headroom_gib >= 0,
                f"learner.checkpoint_headroom_gib must be >= 0, got {self.checkpoint_headroom_gib}")
        require(0 <= self.min_model_flops_utilization < 1,
                f"learner.min_model_flops_utilization must be in [0, 1), got {self.min_model_flops_utilization}")
        require(self.num_epochs >= 1, f"learner.num_epochs must be >= 1, got {self.num_epochs}")
        require(math.isfinite(self.advantage_eps) and self.advantage_eps > 0,
                 f"learner.advantage_eps must be > 0, got {self.advantage_eps}")
        require(all(d.strip() and Path(d).expanduser().is_absolute() for d in self.shared_dirs),
                f"learner.shared_dirs must hold absolute paths, got {self.shared_dirs}")
        require(self.num_reports_kept >= 1, f"learner.num_reports_kept must be >= 1, got {self.num_reports_kept}")
        require(self.num_checkpoints_kept >= 1,
                 f"learner.num_checkpoints_kept must be >= 1, got {self.num_checkpoints_kept}")

    @property
    def clip_high(self) -> float:
        """The effective upper clip range ε_high."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high
