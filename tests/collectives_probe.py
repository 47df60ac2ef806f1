"""Gradient clipping, LARS, the fused and foreach optimizers under FSDP, and DDP's reduction of GradCache's gradients,
on 2 gloo ranks, for tests/test_collectives.py: collectives counted on every rank (torch's CommDebugMode: the c10d
and functional ones), arithmetic against references on whole tensors.

    torchrun --nproc_per_node=2 tests/collectives_probe.py OUT.json RUN_DIR

1. A float64 model that FSDP shards but for two parameters it leaves whole (a 2-D one and a 0-dim one, as a ViT's
   tokens and CLIP's logit scale), every rank on the same batch, so its gradients are those of an unsharded copy:
   clip_grad_norm, three LARS steps against a hand-written per-parameter LARS on the copy's whole tensors, and three
   steps of solo's AdamW and SGD against the same on the copy.
2. DDP as solo.train.distribute wraps a model, with backward passes past the wrapper (GradCache's).
3. One FSDP step of MAE (a ViT, optim.grad_clip=1.0) and of SimCLR (a ResNet, LARS) through the trainer: the
   collectives inside the clipping and inside the optimizer step.
Known-wrong variants alike: the clipping that gathers each shard's norm on its own (what solo did before), the LARS
that takes the norms of its DTensors one by one, torch's fused AdamW on a group of shards and whole parameters, DDP
with static_graph=True.
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from solo.distributed.env import process_group
from solo.optim import LARS, OPTIMIZERS, build_optimizer, clip_grad_norm
from solo.train import step as step_module
from solo.train.distribute import distribute
from solo.train.trainer import Trainer
from tests.test_methods import method_overrides
from tests.test_strategies import SIMCLR
from tests.test_train import compose_cfg


def counted(fn, *args):
    with CommDebugMode() as mode:
        out = fn(*args)
    return out, mode.get_total_counts()


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def norm_per_parameter(grads: list[torch.Tensor]) -> torch.Tensor:
    """The known-wrong clipping's norm (what solo's did before): each shard's norm gathered by a collective of its
    own. (Its scaling, on the local tensors, issues none.)"""
    return torch.linalg.vector_norm(torch.stack([whole(torch.linalg.vector_norm(g)) for g in grads]))


class LARSPerParameter(LARS):
    """The known-wrong LARS: the norms of each DTensor weight and gradient, each its own reduction."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.add(p, alpha=group["weight_decay"])
                if not group["lars_exclude"]:
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    g = g * torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm, 1.0)
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(g)
                p.add_(buf, alpha=-group["lr"])


def reference_lars_step(params: list, grads: list, buffers: list, groups: list[dict]) -> None:
    """One LARS step on whole tensors, parameter by parameter, as written in the LARS paper (You et al. 2017)."""
    for group in groups:
        for i in group["at"]:
            g = grads[i] + group["weight_decay"] * params[i]
            if not group["lars_exclude"]:
                w_norm, g_norm = params[i].norm(), g.norm()
                if w_norm > 0 and g_norm > 0:
                    g = g * (group["eta"] * w_norm / g_norm)
            buffers[i] = group["momentum"] * buffers[i] + g
            params[i] = params[i] - group["lr"] * buffers[i]


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)
        self.tokens = nn.Parameter(torch.randn(2, 6))  # left whole by FSDP
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-dim: left whole

    def forward(self, x):
        return self.second(torch.tanh(self.first(x + self.tokens.sum(0)))).square().mean() * self.scale


def sharded_toy() -> tuple:
    """(the toy sharded by FSDP, an unsharded copy, the copy's starting weights, an input), the same on every rank."""
    torch.manual_seed(0)
    model = Toy().double()
    copy_ = copy.deepcopy(model)
    start = [p.detach().clone() for p in copy_.parameters()]
    whole_params = {model.tokens, model.scale}
    fully_shard(model.first, ignored_params=whole_params)
    fully_shard(model, ignored_params=whole_params)
    return model, copy_, start, torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def toy_checks() -> dict:
    model, copy_, start, x = sharded_toy()
    names = [n for n, _ in model.named_parameters()]
    out = {}

    def backward():
        for p in [*model.parameters(), *copy_.parameters()]:
            p.grad = None
        model(x).backward()
        copy_(x).backward()

    backward()
    grads = [p.grad for p in copy_.parameters()]
    want_total = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    want_grads = [g * min(1.0, 0.01 / (float(want_total) + 1e-6)) for g in grads]
    out["sharded_grads"] = sum(isinstance(p.grad, DTensor) for p in model.parameters())
    total, out["clip"] = counted(clip_grad_norm, list(model.parameters()), 0.01)
    out["clip_total_error"] = float((total - want_total).abs() / want_total)
    out["clip_grad_error"] = max(float((whole(p.grad) - g).abs().max()) for p, g in zip(model.parameters(), want_grads))
    _, out["clip_per_parameter"] = counted(norm_per_parameter, [p.grad for p in model.parameters()])

    adapted = [i for i, n in enumerate(names) if n.endswith("weight") or n == "tokens"]  # a whole one among them
    settings = [
        dict(at=adapted, lars_exclude=False, weight_decay=0.1, eta=0.02, momentum=0.9, lr=0.5),
        dict(
            at=[i for i in range(len(names)) if i not in adapted],
            lars_exclude=True,
            weight_decay=0.05,
            momentum=0.8,
            lr=0.3,
        ),
    ]
    params = list(model.parameters())
    groups = [{**{k: v for k, v in s.items() if k != "at"}, "params": [params[i] for i in s["at"]]} for s in settings]
    optimizer = LARS(groups, lr=0.3, momentum=0.9, eta=0.02)
    want = [p.clone() for p in start]
    buffers = [torch.zeros_like(p) for p in want]
    out["lars"], out["lars_weight_error"] = [], 0.0
    for _ in range(3):
        with torch.no_grad():
            copy_.load_state_dict(dict(zip(names, want)))
        backward()
        reference_lars_step(want, [p.grad for p in copy_.parameters()], buffers, settings)
        out["lars"].append(counted(optimizer.step)[1])
        worst = max(float((whole(p.detach()) - w).abs().max()) for p, w in zip(model.parameters(), want))
        out["lars_weight_error"] = max(out["lars_weight_error"], worst)
    out["lars_moved"] = max(float((w - w0).abs().max()) for w, w0 in zip(want, start))
    out["adapted_sharded"] = sum(isinstance(params[i], DTensor) for i in adapted)
    out["lars_per_parameter"] = counted(LARSPerParameter(groups, lr=0.3).step)[1]
    return out


def optimizer_checks() -> dict:
    """solo's AdamW (fused) and SGD (foreach on shards) on the toy model sharded, against the same on an unsharded
    copy: FSDP's shards and the whole parameters in one group, which one torch kernel call cannot take."""
    out = {}
    for name in ("adamw", "sgd"):
        model, copy_, start, x = sharded_toy()
        config = OPTIMIZERS.config(name, weight_decay=0.1)
        sharded, unsharded = (build_optimizer(config, [{"params": list(m.parameters())}], 0.1) for m in (model, copy_))
        for _ in range(3):
            for m, optimizer in ((model, sharded), (copy_, unsharded)):
                m(x).backward()
                optimizer.step()
                optimizer.zero_grad()
        out[name] = {
            "kernels": [
                {k: v for k, v in o.defaults.items() if k in ("fused", "foreach")} for o in (sharded, unsharded)
            ],
            "error": max(
                float((whole(p.detach()) - q).abs().max()) for p, q in zip(model.parameters(), copy_.parameters())
            ),
            "moved": max(float((q.detach() - w).abs().max()) for q, w in zip(copy_.parameters(), start)),
        }
    model(x).backward()
    try:  # the known-wrong: torch's fused AdamW on the group as it is
        torch.optim.AdamW(model.parameters(), fused=True).step()
        out["torch_fused"] = "stepped"
    except RuntimeError as e:
        out["torch_fused"] = str(e)
    return out


def ddp_checks(device) -> dict:
    """GradCache's pattern under DDP as solo.train.distribute wraps the model (gradients as bucket views): each step a
    backward past the wrapper, then one through it, for 3 steps. The gradients must be the mean over the ranks of
    each rank's sum of both, computed by hand; the known-wrong variant, DDP with static_graph=True, leaves them
    unreduced after its first step."""
    out = {}
    for name in ("solo", "static_graph"):
        torch.manual_seed(0)
        model, by_hand = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
        by_hand.load_state_dict(model.state_dict())
        if name == "solo":
            forward = distribute(model, device, strategy="ddp", sync_batchnorm=False)
        else:
            forward = nn.parallel.DistributedDataParallel(model, static_graph=True)
        draw = torch.Generator().manual_seed(dist.get_rank())
        out[name] = []
        for _ in range(3):
            past, through = (torch.randn(4, 3, dtype=torch.float64, generator=draw) for _ in range(2))
            model(past).sum().backward()
            forward(through).sum().backward()
            (by_hand(past).sum() + by_hand(through).sum()).backward()
            want = [p.grad.clone() for p in by_hand.parameters()]
            for g in want:
                dist.all_reduce(g)
                g /= dist.get_world_size()
            out[name].append(max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), want)))
            for p in [*model.parameters(), *by_hand.parameters()]:
                p.grad = None
    return out


def trainer_step(env, device, overrides: list[str], run_dir: Path, patch) -> dict:
    cfg = compose_cfg([*overrides, "trainer.strategy=fsdp", "data.batch_size=8"])
    trainer = Trainer(cfg, run_dir, env, device)
    batch = next(iter(trainer.loaders.train))  # on the device: the source moves its batches
    found = {}
    patch(trainer, found)
    trainer.train_step(batch, 0)
    return found


def count_clipping(trainer, found):
    def clip(params, max_norm):
        grads = [p.grad for p in params if p.grad is not None]
        found["sharded_grads"] = sum(isinstance(g, DTensor) for g in grads)
        old, found["clip_per_parameter"] = counted(norm_per_parameter, grads)  # on the same gradients, first
        total, found["clip"] = counted(clip_grad_norm, params, max_norm)
        found["clip_total_relative_error"] = float((total - old).abs() / old)
        return total

    step_module.clip_grad_norm = clip


def count_optimizer(trainer, found):
    optimizer = trainer.train_step.optimizer
    step = optimizer.step

    def counted_step(*args, **kwargs):
        _, found["optimizer"] = counted(step, *args, **kwargs)

    optimizer.step = counted_step
    params = [p for g in optimizer.param_groups if not g["lars_exclude"] for p in g["params"]]
    found["adapted_sharded"] = sum(isinstance(p, DTensor) for p in params)


def main(out: str, run_dir: str) -> None:
    with process_group() as (env, device):
        results = {"toy": toy_checks(), "optimizers": optimizer_checks(), "ddp": ddp_checks(device)}
        mae = method_overrides("mae") + ["optim.grad_clip=1.0"]
        results["mae"] = trainer_step(env, device, mae, Path(run_dir) / "mae", count_clipping)
        results["simclr"] = trainer_step(env, device, SIMCLR, Path(run_dir) / "simclr", count_optimizer)
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, results)
        if env.is_main:
            Path(out).write_text(json.dumps(gathered))


if __name__ == "__main__":
    main(*sys.argv[1:])
