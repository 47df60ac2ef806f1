"""How the model is prepared for training, torchtitan's order: activation checkpointing and compilation per block
(`trainer.activation_checkpointing`, `trainer.compile`), then how W > 1 processes hold it (`trainer.strategy`):
global BatchNorm statistics first, then

* ddp: a whole copy on every process, gradients averaged by DDP;
* fsdp: FSDP2 (`torch.distributed.fsdp.fully_shard`): every block of every tower (ViT blocks, ResNet stages,
  Transformer layers), a ViT's patch embedding and norms, then every tower and head, then the rest are sharded
  units: each holds 1/W of its parameters, gradients and optimizer state, gathered for its forward and backward,
  the gradients reduce-scattered with the same average as DDP's. Parameters become DTensors, so the optimizer,
  gradient clipping and EMA updates compute on shards what they computed on whole tensors (norms are global).

Either way the step's arithmetic is unchanged: the losses return W times their share of the global loss and
both strategies average the gradients over W (solo.distributed.collectives).
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from solo.backbones import WHERE_BLOCKS_ARE, blocks_of
from solo.backbones.vit import is_vit, parts_called_apart
from solo.distributed import world_size
from solo.distributed.batchnorm import convert_sync_batchnorm, group_batchnorms, row_groups_replayed
from solo.errors import ConfigError

# Buffers need no sync in the forward: with SyncBatchNorm every rank computes the same running statistics.
# Newer torch names this forward_sync_buffers (broadcast_buffers warns there); older versions the other
# (docs/performance.md lists the torch versions checked).
_DDP_ARGS = inspect.signature(nn.parallel.DistributedDataParallel).parameters
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_ARGS else {"broadcast_buffers": False}
)
# DDP warns when a gradient's strides differ from its bucket's (for the first such gradient of the process). A 1x1
# convolution's weight gradient (out, in, 1, 1) from channels_last inputs (solo's layout on GPUs; compiled kernels'
# on the CPU) differs only in the strides of its size-1 dimensions: the same memory, nothing to act on
# (pytorch/pytorch#157862), so that warning is not shown; any other is.
warnings.filterwarnings(
    "ignore",
    message=r"(?s)Grad strides do not match bucket view strides.*"
    r"grad\.sizes\(\) = \[\d+, (\d+), 1, 1\], strides\(\) = \[\1, 1, \d+, \d+\]\s*"
    r"bucket_view\.sizes\(\) = \[\d+, \1, 1, 1\], strides\(\) = \[\1, 1, 1, 1\]",
)


def distribute(
    model: nn.Module,
    device: torch.device,
    *,
    strategy: str = "ddp",
    sync_batchnorm: bool,
    keep_local: tuple = (),
    reshard_after_forward: bool = True,
    precision: str = "32",
) -> nn.Module:
    """Make `model`'s BatchNorms take the views of one call as row groups (solo.distributed.batchnorm), convert them to
    SyncBatchNorm in place (W > 1 and `sync_batchnorm`, except inside the `keep_local` submodules), then wrap it in DDP
    or shard it with FSDP2 in place; returns what to call (`model` itself on one process and under FSDP). The model
    must offer `towers()`: its modules run on their own (backbones, heads, teachers, the probe), each sharded as one
    unit (see `fsdp_units`)."""
    group_batchnorms(model)
    # Checked on one process too, so a backbone FSDP cannot shard fails on a laptop as it would on the cluster.
    units = fsdp_units(model) if strategy == "fsdp" else []
    if world_size() == 1:
        return model
    if sync_batchnorm:
        convert_sync_batchnorm(model, skip=keep_local)
    if strategy == "fsdp":
        # Parameters that stay whole on every rank, their gradients averaged over ranks after the backward
        # (average_whole_gradients): 0-dim ones (CLIP's logit scale), which FSDP2 cannot shard, and a ViT's own tokens
        # and position embeddings, which masked-image methods use outside the ViT's forward.
        whole = {p for p in model.parameters() if p.dim() == 0}
        for vit in vits(model):
            whole.update(parts_called_apart(vit)[1])
        model.whole_parameters = [p for p in model.parameters() if p in whole and p.requires_grad]
        for unit in [*units, model]:
            fully_shard(
                unit,
                reshard_after_forward=reshard_after_forward,
                ignored_params=whole,
                mp_policy=mixed_precision(unit, precision),
            )
        # GradCache's passes call encode, not forward: it must gather the root's parameters too.
        register_fsdp_forward_method(model, "encode")
        return model
    # Gradients as views of DDP's buckets: reduced in place, no second copy of them kept. Not static_graph: DDP counts
    # the gradient hooks of its first step's window as the graph, and GradCache's passes past the wrapper in that
    # window (trainer.accumulate > 1) would leave the parameters they reach unreduced from the second step on;
    # without find_unused_parameters DDP already orders its buckets as the gradients come after the first step.
    return nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **NO_BUFFER_SYNC,
    )


def blocks(model: nn.Module) -> list[nn.Module]:
    """Every block of every tower of `model` (a model with `towers()`, as PretrainModel), each once."""
    found = []
    for tower in model.towers():
        found += [b for b in blocks_of(tower) if b not in found]
    return found


def checkpoint_blocks(model: nn.Module) -> None:
    """Activation checkpointing per block: each block keeps only its input and runs its forward again in the
    backward (the same random state, so dropout and drop-path draw the same). The second forward must leave no
    trace: BatchNorm's running statistics would otherwise be updated twice."""
    for block in blocks(model):
        checkpoint(block, context_fn=partial(_recomputed_alike, block))


def _recomputed_alike(block: nn.Module) -> tuple:
    """(forward's, recomputation's) contexts: the per-sample draws and the views' row groups (BatchNorm's per-view
    statistics) replayed, the buffers left as they were."""
    draws = next((m.draws for m in block.modules() if getattr(m, "draws", None) is not None), None)
    record_draws, replay_draws = draws.recorded_and_replayed() if draws is not None else (nullcontext(), nullcontext())
    record_groups, replay_groups = row_groups_replayed(block)

    @contextmanager
    def forward():
        with record_draws, record_groups:
            yield

    @contextmanager
    def recompute():
        with replay_draws, replay_groups, kept_buffers(block):
            yield

    return forward(), recompute()


@contextmanager
def kept_buffers(module: nn.Module):
    """Buffers (BatchNorm running statistics, counters) restored on exit: passes that must leave no trace."""
    saved = [b.clone() for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(module.buffers(), saved):
                b.copy_(s)


def cannot_compile() -> str | None:
    """Why torch.compile does not work here (no C++ compiler for the CPU, an unsupported platform), or None."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(2))  # compiling anything needs the whole toolchain
    except Exception as e:  # dynamo and inductor raise many kinds: a missing compiler, an unsupported Python
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return f"torch.compile does not work here ({type(e).__name__}{': ' + first if first else ''})"
    return None


def compile_model(model: nn.Module, scope: str) -> None:
    """torch.compile in place (names and state dicts unchanged): each block of each tower (scope "blocks": small
    graphs, quick to compile, the same code for every block), or each image backbone whole ("backbone": one graph,
    longer to compile, no break between blocks). Where compilation does not work (no C++ compiler for the CPU, an
    unsupported platform), one warning that says why, and the model runs eager."""
    reason = cannot_compile()
    if reason is not None:
        warnings.warn(f"trainer.compile={scope}: {reason}; training runs uncompiled", stacklevel=2)
        return
    for module in blocks(model) if scope == "blocks" else model.backbones():
        module.compile(dynamic=False)  # batch shapes repeat; dynamic shapes fail to compile some backwards on the CPU


def mixed_precision(unit: nn.Module, precision: str) -> MixedPrecisionPolicy:
    """bf16: the unit's parameters gathered and used in bf16, gradients reduced and weights kept in float32. A unit
    with BatchNorm gathers float32 and computes under autocast, as DDP does: BatchNorm's float32 statistics cannot
    meet bf16 weights."""
    if precision != "bf16" or any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in unit.modules()):
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def average_whole_gradients(model: nn.Module) -> None:
    """Under FSDP, the gradients of the parameters kept whole (`distribute`) averaged over ranks, after the step's
    backward passes (GradCache's included: the average is linear), in one all-reduce per dtype, in the model's order
    on every rank. Not as each gradient is accumulated: that order is each rank's backward's, which differs on a
    rank with no rows (a ViT's empty batch takes another path through it), and the ranks' collectives would
    mismatch. A parameter that got no gradient on this rank adds zeros."""
    params = getattr(model, "whole_parameters", [])
    for dtype in dict.fromkeys(p.dtype for p in params):
        group = [p for p in params if p.dtype == dtype]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
        dist.all_reduce(flat)
        flat.div_(world_size())
        for p, grad in zip(group, flat.split([p.numel() for p in group])):
            p.grad = grad.view_as(p)


def vits(model: nn.Module) -> list[nn.Module]:
    """Every timm Vision Transformer among `model`'s towers (backbones and teachers' copies)."""
    return [m for tower in model.towers() for m in tower.modules() if is_vit(m)]


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules to shard, inner ones first: each block of each tower, a ViT's patch embedding and norms, then
    each tower (anything that is called on its own, such as the backbone by the evaluator, a teacher by the method
    or a ViT's patch embedding by a masked-image method, must be a unit: a call that bypasses its unit finds its
    parameters still sharded). Raises ConfigError for a backbone with no blocks."""
    towers = [t for t in model.towers() if next(t.parameters(), None) is not None]
    units = blocks(model)
    for vit in vits(model):
        units += [m for m in parts_called_apart(vit)[0] if m not in units]
    for backbone in model.backbones():
        if not any(b in units for b in backbone.modules()):
            raise ConfigError(
                f"trainer.strategy=fsdp shards a backbone block by block, and {type(backbone).__name__} has no "
                f"blocks where solo looks for them ({WHERE_BLOCKS_ARE}): use trainer.strategy=ddp, or a backbone "
                "that keeps its blocks there"
            )
    return units + [t for t in towers if t not in units]


def gradient_sync(forward: nn.Module, enabled: bool) -> None:
    """Whether the next backward averages the gradients over ranks: GradCache turns it off for all micro-batches
    but the last (FSDP keeps their unsharded gradients until then; the DDP wrapper is not called by them)."""
    if hasattr(forward, "set_requires_gradient_sync"):
        forward.set_requires_gradient_sync(enabled)
