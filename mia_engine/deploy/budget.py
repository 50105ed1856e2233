"""The per-GPU memory budget of a config, from the models' ``config.json`` files, and its refusals.

Every figure is a formula over the shapes (``shapes.py``) and config values, written once here:

- **engine share** of each of its GPUs = ``gpu_memory_utilization`` x GPU memory (what vLLM claims).
  Inside it: weights / (TP x PP); LoRA slots = ``max_loras`` x rank-``max_lora_rank`` A and B matrices of
  q, k, v, o, gate, up, down in every layer, / (TP x PP); profiling activations ≈ T x (4·H + 2·I/TP) x
  dtype bytes + ``max_num_seqs`` x V x 4 (fp32 logits), T = ``max_num_batched_tokens``; a CUDA context;
  the **KV cache** is what is left, in tokens = bytes / (2 x layers/PP x max(1, kv_heads/TP) x head_dim x
  dtype bytes). Vision-tower weights are counted even when only token ids are sent; unless the engine is
  ``language_model_only``, so is the tower's start-up profile: as many largest images as the encoder budget
  holds, their activations and their cached embeddings (``vision_profile_bytes``).
- **learner** (PEFT copy of the Planner's base on ``learner.device``): base weights in ``learner.dtype``;
  the LoRA (rank = the Planner engine's ``max_lora_rank``, all seven projections) in fp32 with its
  gradient and AdamW's two moments (16 bytes/parameter); activations with gradient checkpointing for
  ``micro_batch_size`` sequences of T = ``learner.max_seq_len`` (or the engine's ``max_model_len``):
  checkpointed layer inputs (L·b·T·H), one layer recomputed (b·T·(8·H + 4·I)) and the final hidden
  states with what the log-probs keep of them (b·T·4·H), all in the learner's dtype; and one chunk of
  ``learner.logit_chunk_size`` positions' logits (C·V x (dtype + 13) bytes: the logits, their fp32
  copy and the log-softmax backward's work).
- **memory**: the encoder's weights (+ one batch of activations) on ``memory.embedder.device``; FAISS
  (fp32 question key + norm per memory and Meta Plan pair, removed rows awaiting compaction, the copy a
  GPU flat index makes as it grows, FAISS's scratch: ``faiss_items``) on ``memory.index_device``; score
  key matrices (fp32, question + caption) on ``memory.score_device``; capacities from the store's
  hard limits (``memory.max_num_stored``, and ``max_num_meta_plans`` where it is lower).
- The serving process pays one ``gpus.cuda_context_gib`` on every GPU it touches.

A GPU whose claims exceed its memory, a KV cache that cannot hold one ``max_model_len`` sequence, a
device id beyond ``gpus.num_gpus``, or a Ray engine whose tensor parallelism spans nodes is refused with a
``ConfigError`` naming the field.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import msgspec

from ..config import ConfigError, EngineConfig, MIAConfig, planner_engine
from ..devices import gpu_index, resolved_devices, serving_device_fields
from ..config.learner import LearnerConfig
from ..config.memory import EmbedderConfig, MemoryConfig
from .shapes import DTYPE_BYTES, DecoderShape, bert_params, decoder_shape, read_config

GIB = 1024**3
ACTIVATION_ROWS_PER_TOKEN = 4
"""Hidden-size-wide rows live per token at vLLM's activation peak (residual, norm out, attn out, o out)."""
LOGIT_BYTES_FP32 = 13
"""Bytes per logit of a log-prob chunk beyond the logits themselves, at the learner's peak: the fp32
scaled logits and up to about three fp32 temporaries of the log-softmax's backward under autograd (a
measured 2 + 13 B per bf16 logit), as for a head with trainable weights; the fused path of a frozen
head needs less (its fp32 softmax and one copy in the model's dtype), so this is an upper bound."""


class Item(msgspec.Struct, frozen=True):
    what: str
    num_bytes: int


class Claim(msgspec.Struct, frozen=True):
    """One component's share of one GPU."""

    owner: str
    """``engine <name> replica i/n``, ``serving process``."""
    field: str
    """The config field to change when this claim does not fit."""
    items: list[Item]
    share_bytes: int
    """What it takes of the GPU (for an engine: its whole ``gpu_memory_utilization`` share)."""
    kv_tokens: int = 0


class GpuBudget(msgspec.Struct):
    gpu: str
    """``0``..``7`` for this node, ``ray:<engine>`` for one GPU of a Ray engine."""
    capacity_bytes: int
    claims: list[Claim] = []

    @property
    def used_bytes(self) -> int:
        return sum(c.share_bytes for c in self.claims)


class Plan(msgspec.Struct):
    gpus: list[GpuBudget]
    shapes: dict[str, DecoderShape]
    notes: list[str]


class OverCommitted(ConfigError):
    """A GPU whose claims exceed its memory; ``plan`` holds every GPU's budget, to show the table."""

    def __init__(self, message: str, result: Plan) -> None:
        super().__init__(message)
        self.plan = result


def plans_gpus(config: MIAConfig) -> bool:
    """Whether the config puts anything on a GPU (so a GPU budget applies): ``gpus.num_gpus``, an engine's
    ``devices`` or Ray executor, or a component device naming CUDA (``auto`` alone does not)."""
    return (config.gpus.num_gpus > 0 or any(e.devices or e.executor_backend == "ray" for e in config.engines.values())
            or any(d.startswith("cuda") for d in serving_device_fields(config).values()))


def plan(config: MIAConfig, model_dir: Callable[[str], Path]) -> Plan:
    """The budget of every GPU of a config; ``model_dir`` maps ``EngineConfig.model`` to a folder.
    ``cuda`` and ``auto`` component devices count as the GPU they resolve to (``devices.resolve_device``).
    Raises ``OverCommitted`` for a GPU that cannot hold its claims, ``ConfigError`` for other refusals."""
    config = resolved_devices(config, plans_gpus(config))
    shapes = {name: _shape(name, e.model, model_dir) for name, e in config.engines.items()}
    num_gpus = _num_gpus(config)
    capacity = int(config.gpus.memory_gib * GIB)
    gpus = {str(g): GpuBudget(str(g), capacity, []) for g in range(num_gpus)}
    notes: list[str] = []
    for name, engine in config.engines.items():
        _place_engine(config, name, engine, shapes[name], gpus, notes)
    _place_serving_process(config, shapes, model_dir, gpus)
    result = Plan(list(gpus.values()), shapes, notes)
    for budget in result.gpus:
        _check_fits(budget, result)
    return result


def engine_share(config: MIAConfig, engine_name: str, model_dir: Callable[[str], Path], capacity_bytes: int,
                 ceiling: float) -> float:
    """``gpu_memory_utilization`` for ``engine_name`` (on the process's first GPU, or its first ``devices``
    entry): ``ceiling`` (vLLM's default) less what the serving process itself claims on that GPU (learner,
    encoders, memory index, its CUDA context; ``_place_serving_process``), as a fraction of
    ``capacity_bytes``, rounded down to 0.01."""
    config = resolved_devices(config, True)
    shapes = {name: _shape(name, e.model, model_dir) for name, e in config.engines.items()}
    gpus = {str(g): GpuBudget(str(g), capacity_bytes, []) for g in range(max(_num_gpus(config), 1))}
    _place_serving_process(config, shapes, model_dir, gpus)
    gpu = str((config.engines[engine_name].devices or [0])[0])
    serving = gpus[gpu].used_bytes if gpu in gpus else 0
    return math.floor(100 * (ceiling - serving / capacity_bytes)) / 100


def _shape(name: str, model: str, model_dir: Callable[[str], Path]) -> DecoderShape:
    try:
        return decoder_shape(read_config(model_dir(model)))
    except (FileNotFoundError, KeyError, ValueError) as err:
        raise ConfigError(f"engines.{name}.model: {str(err).strip(chr(34))}") from None


def _num_gpus(config: MIAConfig) -> int:
    named = [d for e in config.engines.values() for d in e.devices]
    named += [d for d in (gpu_index(v) for v in serving_device_fields(config).values()) if d is not None]
    highest = max(named, default=-1) + 1
    if config.gpus.num_gpus and highest > config.gpus.num_gpus:
        field = next(f for f, v in device_fields(config).items() if highest - 1 in v)
        raise ConfigError(f"{field}: GPU {highest - 1} does not exist (gpus.num_gpus = {config.gpus.num_gpus})")
    return config.gpus.num_gpus or highest


def device_fields(config: MIAConfig) -> dict[str, list[int]]:
    """The GPU ids each config field names (``engines.<name>.devices``, ``cuda:N`` component devices)."""
    fields = {f"engines.{n}.devices": list(e.devices) for n, e in config.engines.items()}
    fields.update({f: [g] for f, v in serving_device_fields(config).items() if (g := gpu_index(v)) is not None})
    return fields


def engine_dtype_bytes(engine: EngineConfig, shape: DecoderShape) -> int:
    name = shape.torch_dtype if engine.dtype == "auto" else engine.dtype
    return DTYPE_BYTES.get(name, 2)


def engine_items(engine: EngineConfig, shape: DecoderShape, batched_tokens: int) -> list[Item]:
    """What one GPU of one replica holds besides its KV cache."""
    b = engine_dtype_bytes(engine, shape)
    split = engine.tensor_parallel_size * engine.pipeline_parallel_size
    items = [Item("weights", shape.num_params * b // split)]
    if engine.enable_lora:
        lora = engine.max_loras * shape.lora_params_per_layer(engine.max_lora_rank) * shape.num_layers * b
        items.append(Item(f"LoRA slots ({engine.max_loras} x r{engine.max_lora_rank})", lora // split))
    tokens = engine.max_num_batched_tokens or batched_tokens
    tp = engine.tensor_parallel_size
    per_token = ACTIVATION_ROWS_PER_TOKEN * shape.hidden_size + 2 * shape.intermediate_size // tp
    items.append(Item("activations (profile)", tokens * per_token * b + engine.max_num_seqs * shape.vocab_size * 4))
    if shape.max_image_tokens and not engine.language_model_only:
        items.append(Item("vision tower activations + encoder cache (profile)",
                          vision_profile_bytes(engine, shape, tokens)))
    return items


def vision_profile_bytes(engine: EngineConfig, shape: DecoderShape, batched_tokens: int) -> int:
    """vLLM profiles the encoder with as many largest images as its encoder budget holds (budget =
    max(batched tokens, one image's tokens)), then keeps their outputs in the encoder cache: the tower's
    activations for those images (not split by tensor parallelism: the tower is replicated) plus the
    cached decoder-width embeddings."""
    budget = max(batched_tokens, shape.max_image_tokens)
    images = max(1, min(budget // shape.max_image_tokens, engine.max_images_per_prompt * engine.max_num_seqs))
    image_tokens = images * shape.max_image_tokens
    b = engine_dtype_bytes(engine, shape)
    return image_tokens * shape.vision_rows_per_image_token * b + budget * shape.hidden_size * b


def kv_bytes_per_token_per_gpu(engine: EngineConfig, shape: DecoderShape) -> int:
    kv_heads = max(1, shape.num_kv_heads // engine.tensor_parallel_size)
    layers = math.ceil(shape.num_layers / engine.pipeline_parallel_size)
    return 2 * layers * kv_heads * shape.head_dim * engine_dtype_bytes(engine, shape)


def _place_engine(config: MIAConfig, name: str, engine: EngineConfig, shape: DecoderShape,
                  gpus: dict[str, GpuBudget], notes: list[str]) -> None:
    if not gpus and not engine.devices and engine.executor_backend != "ray":
        _place_host_engine(name, engine, shape, gpus)
        return
    replica = engine.tensor_parallel_size * engine.pipeline_parallel_size
    share = int(engine.gpu_memory_utilization * config.gpus.memory_gib * GIB)
    context = int(config.gpus.cuda_context_gib * GIB)
    items = [*engine_items(engine, shape, config.gpus.max_num_batched_tokens), Item("CUDA context", context)]
    kv_bytes = share - sum(i.num_bytes for i in items)
    kv_tokens = max(kv_bytes, 0) // kv_bytes_per_token_per_gpu(engine, shape)
    if kv_tokens < engine.max_model_len:
        raise ConfigError(f"engines.{name}.gpu_memory_utilization: {share / GIB:.1f} GiB per GPU leaves room "
                          f"for {kv_tokens} KV tokens, fewer than max_model_len {engine.max_model_len}")
    items.append(Item(f"KV cache ({kv_tokens} tokens)", kv_bytes))
    if engine.executor_backend == "ray":
        _place_ray_engine(config, name, engine, items, share, kv_tokens, gpus, notes)
        return
    for index, gpu in enumerate(engine_gpus(engine)):
        r, rank = divmod(index, replica)
        owner = f"engine {name} replica {r + 1}/{engine.data_parallel_size}"
        owner += f" rank {rank + 1}/{replica}" if replica > 1 else ""
        if str(gpu) not in gpus:
            raise ConfigError(f"engines.{name}.devices: GPU {gpu} does not exist (gpus.num_gpus = {len(gpus)})")
        gpus[str(gpu)].claims.append(Claim(owner, f"engines.{name}.gpu_memory_utilization", items, share, kv_tokens))


def engine_gpus(engine: EngineConfig) -> list[int]:
    """The GPUs of this node an engine runs on, replica by replica: its ``devices``, or the first TP x PP x DP."""
    replica = engine.tensor_parallel_size * engine.pipeline_parallel_size
    return list(engine.devices) or list(range(replica * engine.data_parallel_size))


def _place_host_engine(name: str, engine: EngineConfig, shape: DecoderShape, gpus: dict[str, GpuBudget]) -> None:
    """No GPU anywhere in the config: vLLM's CPU build, KV cache of ``cpu_kv_cache_bytes``."""
    items = [i for i in engine_items(engine, shape, 0) if not i.what.startswith("activations")]
    kv = engine.cpu_kv_cache_bytes()
    items.append(Item(f"KV cache ({kv // kv_bytes_per_token_per_gpu(engine, shape)} tokens)", kv))
    host = gpus.setdefault("host", GpuBudget("host", 0, []))
    host.claims.append(Claim(f"engine {name} (CPU)", f"engines.{name}.cpu.kv_cache_space_gib", items,
                             sum(i.num_bytes for i in items)))


def _place_ray_engine(config: MIAConfig, name: str, engine: EngineConfig, items: list[Item], share: int,
                      kv_tokens: int, gpus: dict[str, GpuBudget], notes: list[str]) -> None:
    """One budget for every GPU of a Ray engine, all on other nodes: this box's Ray node advertises no GPU
    (docs/DEPLOY_8GPU.md, "Past one box"), so its own GPUs stay with the local claims above. vLLM ranks the workers
    node by node, so a tensor-parallel group stays on one node only while it divides the node's GPUs."""
    tp, per_node = engine.tensor_parallel_size, config.gpus.gpus_per_node
    replica = tp * engine.pipeline_parallel_size
    if tp > per_node or (replica > per_node and per_node % tp):
        raise ConfigError(f"engines.{name}.tensor_parallel_size: a group of {tp} GPUs would straddle nodes of "
                          f"gpus.gpus_per_node = {per_node}; use a divisor of {per_node} and split across nodes "
                          "with pipeline_parallel_size")
    world = replica * engine.data_parallel_size
    nodes = math.ceil(world / per_node)
    key = f"ray:{name}"
    gpus[key] = GpuBudget(key, int(config.gpus.memory_gib * GIB),
                          [Claim(f"engine {name} (each of {world} Ray GPUs)", f"engines.{name}.gpu_memory_utilization",
                                 items, share, kv_tokens)])
    notes.append(f"engine {name}: Ray executor, TP {tp} x PP {engine.pipeline_parallel_size} x DP "
                 f"{engine.data_parallel_size} = {world} GPUs on >= {nodes} node(s) of {per_node}, none of them this "
                 "box (start its Ray node with --num-gpus=0; docs/DEPLOY_8GPU.md, \"Past one box\")")
    static = [engine.model] + [r.adapter for r in config.roles.values() if r.engine == name and r.adapter]
    notes.append(f"engine {name}: every Ray node reads {', '.join(static)} at the same path")
    if importlib.util.find_spec("ray") is None:
        notes.append(f"engine {name}: the ray package is not installed here (pip install -e '.[ray]')")


def learner_items(learner: LearnerConfig, shape: DecoderShape, rank: int, max_model_len: int) -> list[Item]:
    """The learner's GPU memory at its peak, for its longest micro-batch (b = ``micro_batch_size``
    sequences of T = ``max_seq_len``, or the engine's ``max_model_len``).

    Checked against a measured step (``python -m mia_engine doctor``). Per LoRA weight: fp32 weight,
    grad and two AdamW moments (16 B), and the step's rollback snapshot of weight and moments (12 B,
    kept on the device). Per token, in the learner's dtype: every layer's checkpointed input (L·H), one
    layer's recompute (8·H + 4·I), and the final hidden states the log-probs read, their flattened copy,
    their per-position gradient rows kept for the backward and the gradient itself (4·H). The log-probs
    (``grpo.chunked_token_logprobs``) make the logits of at most C = ``logit_chunk_size`` positions at a
    time, so only one chunk's exist: C·V logits in the learner's dtype plus LOGIT_BYTES_FP32 each for
    the fp32 log-softmax's forward and backward, whatever the sequence length. Summing the layers' and
    the chunk's peaks over-counts a little: the chunks are done before the backward recomputes a layer."""
    b = DTYPE_BYTES[learner.dtype]
    lora = shape.lora_params_per_layer(rank) * shape.num_layers
    tokens = learner.micro_batch_size * (learner.max_seq_len or max_model_len)
    per_token = (shape.num_layers + 8 + 4) * shape.hidden_size + 4 * shape.intermediate_size
    chunk = min(learner.logit_chunk_size, tokens)
    return [
        Item("learner weights", shape.num_text_params * b),
        Item(f"learner LoRA r{rank} + grads + AdamW + rollback snapshot (fp32)", lora * (16 + 12)),
        Item("learner activations (checkpointed)", tokens * per_token * b),
        Item(f"learner log-probs ({chunk}-position logit chunk)", chunk * shape.vocab_size * (b + LOGIT_BYTES_FP32)),
    ]


def memory_items(config: MIAConfig, encoder: dict) -> dict[str, list[Item]]:
    """Items of the memory components by the device field that places them."""
    memory, dim = config.memory, int(encoder["hidden_size"])
    # what the store can hold whatever the clear policy: its hard capacities (``max_num_entries`` is the
    # "cap" policy's softer target, and ``max_num_meta_plans = 0`` means "up to the hard capacity")
    entries = memory.max_num_stored
    pairs = min(memory.max_num_meta_plans or memory.max_num_stored, memory.max_num_stored)
    return {
        "memory.embedder.device": [encoder_item(memory.embedder, encoder, "encoder")],
        "memory.index_device": faiss_items(memory, dim, entries, pairs),
        "memory.score_device": [Item("score key matrices", 2 * entries * dim * 4)],
    }


def encoder_item(embedder: EmbedderConfig, encoder: dict, what: str) -> Item:
    """A sentence encoder (its ``config.json``): BERT weights and one batch of activations."""
    dim, encoder_bytes = int(encoder["hidden_size"]), 2 if embedder.dtype == "bfloat16" else 4
    activations = embedder.batch_size * int(encoder["max_position_embeddings"]) \
        * (4 * dim + int(encoder["intermediate_size"])) * encoder_bytes
    return Item(f"{what} weights + activations", bert_params(encoder) * encoder_bytes + activations)


def faiss_items(memory: MemoryConfig, dim: int, entries: int, pairs: int) -> list[Item]:
    """The store's FAISS indexes on a GPU (``memory/index.py``): one flat index per bucket and label plus
    the Meta Plan index, each row a question key (fp32) and its L2 norm (fp32), each index holding up to
    ``MAX_NUM_REMOVED_ROWS`` removed rows awaiting compaction; a GPU flat index reallocates its storage to
    the exact size on every add, so the largest index is briefly held twice; and the scratch arena of the
    store's one ``StandardGpuResources`` (``GPU_TEMP_MEMORY_BYTES``, set explicitly)."""
    from ..memory.entries import Modality
    from ..memory.index import GPU_TEMP_MEMORY_BYTES, MAX_NUM_REMOVED_ROWS

    num_indexes = 2 * len(get_args(Modality)) * len(memory.categories) + 1
    row_bytes = dim * 4 + 4
    rows = entries + pairs + num_indexes * MAX_NUM_REMOVED_ROWS
    return [
        Item(f"FAISS index ({entries} memories, {pairs} Meta Plan pairs, {num_indexes} x "
             f"{MAX_NUM_REMOVED_ROWS} removed rows)", rows * row_bytes),
        Item("FAISS growth copy (largest index, on add)", (max(entries, pairs) + MAX_NUM_REMOVED_ROWS) * row_bytes),
        Item("FAISS scratch (StandardGpuResources temp memory)", GPU_TEMP_MEMORY_BYTES),
    ]


_SERVING_PARTS = {"memory.embedder.device": "embedder", "memory.score_device": "score",
                  "memory.index_device": "index", "tools.embedder.device": "search encoder",
                  "learner.device": "learner"}
"""How the dry run names each component of the serving process, by the field that places it."""


def _place_serving_process(config: MIAConfig, shapes: dict[str, DecoderShape], model_dir: Callable[[str], Path],
                           gpus: dict[str, GpuBudget]) -> None:
    by_field: dict[str, list[Item]] = {}
    if gpu_index(config.learner.device) is not None:
        engine_name = planner_engine(config)
        engine = config.engines[engine_name]
        by_field["learner.device"] = learner_items(config.learner, shapes[engine_name], engine.max_lora_rank,
                                                   engine.max_model_len)
        if config.learner.process == "spawn":  # a CUDA context of its own beside the serving process's
            by_field["learner.device"].append(Item("learner process CUDA context", int(config.gpus.cuda_context_gib * GIB)))
    devices = serving_device_fields(config)
    if any(gpu_index(devices[f]) is not None for f in devices if f.startswith("memory.")):
        encoder = read_config(_encoder_dir(config.memory.embedder))
        by_field.update({f: items for f, items in memory_items(config, encoder).items()
                         if gpu_index(devices[f]) is not None})
    search = config.tools.embedder
    if search != config.memory.embedder and gpu_index(search.device) is not None:  # else the one is shared
        by_field["tools.embedder.device"] = [encoder_item(search, read_config(_encoder_dir(search)),
                                                          "search encoder")]
    per_gpu: dict[int, list[tuple[str, Item]]] = {}
    for field, items in by_field.items():
        per_gpu.setdefault(gpu_index(devices[field]), []).extend((field, i) for i in items)  # type: ignore[arg-type]
    for gpu, entries in sorted(per_gpu.items()):
        if str(gpu) not in gpus:
            raise ConfigError(f"{entries[0][0]}: GPU {gpu} does not exist (gpus.num_gpus = {len(gpus)})")
        items = [i for _, i in entries] + [Item("CUDA context", int(config.gpus.cuda_context_gib * GIB))]
        _check_learner_headroom(config, gpu, entries)
        field = max(entries, key=lambda e: e[1].num_bytes)[0]  # the biggest user is the one to move
        parts = sorted({_SERVING_PARTS[f] for f, _ in entries})
        gpus[str(gpu)].claims.append(Claim(f"serving process ({', '.join(parts)})", field, items,
                                           sum(i.num_bytes for i in items)))


def _check_learner_headroom(config: MIAConfig, gpu: int, entries: list[tuple[str, Item]]) -> None:
    """With ``learner.checkpoint_layers = -1`` the learner keeps activations in what is free on its GPU less
    ``checkpoint_headroom_gib``, measured before each micro-batch: the serving process's other parts on that
    GPU (at their capacities, with its CUDA context) must fit that headroom, since they may grow later."""
    learner = config.learner
    if gpu_index(learner.device) != gpu or not learner.gradient_checkpointing or learner.checkpoint_layers >= 0:
        return
    others = sum(i.num_bytes for f, i in entries if f != "learner.device") + int(config.gpus.cuda_context_gib * GIB)
    if others > learner.checkpoint_headroom_gib * GIB:
        raise ConfigError(f"learner.checkpoint_headroom_gib: {learner.checkpoint_headroom_gib:g} GiB is less than "
                          f"the {others / GIB:.2f} GiB the serving process's other parts on GPU {gpu} need at their "
                          "capacities; raise it, or set learner.checkpoint_layers to a fixed number")


def _encoder_dir(embedder: EmbedderConfig) -> Path:
    if embedder.model_dir:
        return Path(embedder.model_dir).expanduser()
    from ..memory.embedder import default_model_dir

    return default_model_dir()


def _check_fits(budget: GpuBudget, result: Plan) -> None:
    if budget.gpu == "host" or budget.used_bytes <= budget.capacity_bytes:  # host memory is not planned
        return
    last = budget.claims[-1]
    raise OverCommitted(f"{last.field}: GPU {budget.gpu} is over-committed: {budget.used_bytes / GIB:.1f} GiB "
                        f"claimed of {budget.capacity_bytes / GIB:.1f} GiB "
                        f"({', '.join(c.owner for c in budget.claims)})", result)
