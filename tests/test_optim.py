"""Tests for solo.optim, checked against hand-computed numbers and torch's own optimizers."""

import math

import pytest
import torch
from torch import nn

from solo.optim import (
    LARS,
    OPTIMIZERS,
    SGD,
    AdamW,
    AdamWConfig,
    LARSConfig,
    SGDConfig,
    build_optimizer,
    clip_grad_norm,
    param_groups,
    warmup_cosine,
)


def _param(values):
    return nn.Parameter(torch.tensor(values, dtype=torch.float64))


def _step(opt, p, grad):
    p.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step()


# ---------------------------------------------------------------- LARS vs. hand-computed updates


def test_lars_two_steps_with_weight_decay_by_hand():
    # lr=0.5, momentum=0.9, wd=0.1, eta=0.02, w=[3,4], g=[0.3,0.4] both steps.
    p = _param([3.0, 4.0])
    opt = LARS([p], lr=0.5, momentum=0.9, weight_decay=0.1, eta=0.02)

    # step 1: g+wd*w = [0.6,0.8] (norm 1), ||w|| = 5 -> trust = 0.02*5/1 = 0.1
    #         buf = [0.06,0.08];  w = [3,4] - 0.5*buf = [2.97, 3.96]
    _step(opt, p, [0.3, 0.4])
    torch.testing.assert_close(p.data, torch.tensor([2.97, 3.96], dtype=torch.float64))

    # step 2: g+wd*w = [0.597,0.796] (norm 0.995), ||w|| = 4.95 -> trust = 0.099/0.995
    #         scaled g = [0.0594,0.0792];  buf = 0.9*[0.06,0.08] + that = [0.1134,0.1512]
    #         w = [2.97,3.96] - 0.5*buf = [2.9133, 3.8844]
    _step(opt, p, [0.3, 0.4])
    torch.testing.assert_close(p.data, torch.tensor([2.9133, 3.8844], dtype=torch.float64))
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], torch.tensor([0.1134, 0.1512], dtype=torch.float64))


def test_lars_without_weight_decay_by_hand():
    # ||w|| = 5, ||g|| = 0.5 -> trust = 0.02*5/0.5 = 0.2;  w = [3,4] - 1.0*0.2*[0.3,0.4]
    p = _param([3.0, 4.0])
    opt = LARS([p], lr=1.0, momentum=0.9, eta=0.02)
    _step(opt, p, [0.3, 0.4])
    torch.testing.assert_close(p.data, torch.tensor([2.94, 3.92], dtype=torch.float64))


def test_lars_trust_is_one_when_a_norm_is_zero():
    # zero weights: trust falls back to 1, so the update is plain lr * g
    p = _param([0.0, 0.0])
    opt = LARS([p], lr=0.5, momentum=0.9, eta=0.02)
    _step(opt, p, [1.0, -2.0])
    torch.testing.assert_close(p.data, torch.tensor([-0.5, 1.0], dtype=torch.float64))
    assert torch.isfinite(p.data).all()

    # zero gradient: nothing moves, nothing becomes NaN
    q = _param([3.0, 4.0])
    opt = LARS([q], lr=0.5, momentum=0.9, eta=0.02)
    _step(opt, q, [0.0, 0.0])
    torch.testing.assert_close(q.data, torch.tensor([3.0, 4.0], dtype=torch.float64))


def test_lars_excluded_group_matches_torch_sgd_exactly():
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(4)]
    for wd in (0.0, 0.05):
        a, b = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
        lars = LARS([{"params": [a], "lars_exclude": True, "weight_decay": wd}], lr=0.1, momentum=0.9, eta=0.02)
        sgd = torch.optim.SGD([b], lr=0.1, momentum=0.9, weight_decay=wd, fused=True)  # LARS's kernel: bit for bit
        for g in grads:
            a.grad, b.grad = g.clone(), g.clone()
            lars.step()
            sgd.step()
            assert torch.equal(a.data, b.data)


def test_lars_skips_params_without_grad_and_supports_closure():
    p, frozen = _param([3.0, 4.0]), _param([1.0, 1.0])
    opt = LARS([p, frozen], lr=0.5, momentum=0.9, weight_decay=0.1, eta=0.02)

    def closure():
        opt.zero_grad()
        loss = (p * torch.tensor([0.3, 0.4], dtype=torch.float64)).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == pytest.approx(0.9 + 1.6)
    torch.testing.assert_close(p.data, torch.tensor([2.97, 3.96], dtype=torch.float64))  # same as by-hand step 1
    assert torch.equal(frozen.data, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert frozen not in opt.state


def _lars_by_hand(weights: list, grads: list, buffers: list, groups: list[dict]) -> None:
    """One LARS step parameter by parameter, as the paper writes it (You et al. 2017); `groups` index the lists."""
    for group in groups:
        for i in group["at"]:
            if grads[i] is None:
                continue
            g = grads[i] + group["weight_decay"] * weights[i]
            if not group["lars_exclude"]:
                w_norm, g_norm = weights[i].norm(), g.norm()
                if w_norm > 0 and g_norm > 0:
                    g = g * (group["eta"] * w_norm / g_norm)
            buffers[i] = group["momentum"] * buffers[i] + g
            weights[i] = weights[i] - group["lr"] * buffers[i]


def test_lars_equals_lars_written_by_hand_parameter_by_parameter():
    """Three float64 steps of an adapted group (weight decay, a zero-initialised weight: trust 1, a parameter with no
    gradient) and an excluded one (its own weight decay, momentum and lr) == the per-parameter loop, to 1e-14 of how
    far the weights moved; the trust ratio matters (without it, the step differs)."""
    torch.manual_seed(0)
    shapes = [(4, 3), (5,), (2, 2), (3,), (6, 2)]
    start = [torch.randn(s, dtype=torch.float64) for s in shapes]
    start[2].zero_()
    settings = [
        dict(at=[0, 2, 4], lars_exclude=False, weight_decay=0.1, eta=0.02, momentum=0.9, lr=0.5),
        dict(at=[1, 3], lars_exclude=True, weight_decay=0.05, eta=0.02, momentum=0.8, lr=0.3),
    ]
    params = [nn.Parameter(w.clone()) for w in start]
    groups = [{**{k: v for k, v in s.items() if k != "at"}, "params": [params[i] for i in s["at"]]} for s in settings]
    optimizer = LARS(groups, lr=1.0)
    steps = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(3)]
    for grads in steps:
        grads[4] = None
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.clone()  # LARS scales the gradients in place
        optimizer.step()

    def by_hand(groups: list[dict]) -> list[torch.Tensor]:
        weights, buffers = [w.clone() for w in start], [torch.zeros_like(w) for w in start]
        for grads in steps:
            _lars_by_hand(weights, grads, buffers, groups)
        return weights

    weights = by_hand(settings)
    moved = max(float((w - w0).abs().max()) for w, w0 in zip(weights, start))
    assert moved > 0.1 and torch.equal(params[4].data, start[4])
    for p, w in zip(params, weights):
        torch.testing.assert_close(p.data, w, rtol=0, atol=1e-14 * moved)
    plain = by_hand([dict(s, lars_exclude=True) for s in settings])  # momentum SGD: no trust ratio
    assert float((params[0].data - plain[0]).abs().max()) > 0.1 * moved


@pytest.mark.parametrize(
    "kwargs", [dict(lr=-1.0), dict(lr=0.1, momentum=-0.1), dict(lr=0.1, weight_decay=-1.0), dict(lr=0.1, eta=0.0)]
)
def test_lars_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError):
        LARS([_param([1.0])], **kwargs)


# ---------------------------------------------------------------- gradient clipping, host reads


def test_clip_grad_norm_of_whole_gradients_in_two_dtypes_on_the_device_and_with_no_collective():
    """One process (as under DDP: whole gradients), float64 and float32 gradients and a parameter with none: scaled to
    the global norm max_norm, the norm of all their elements written by hand; no collective, no host read. Under
    max_norm they are left as they were."""
    from torch.distributed.tensor.debug import CommDebugMode

    from solo.train.host_reads import HostReads

    torch.manual_seed(0)
    dtypes = [torch.float64, torch.float32, torch.float64, torch.float32]
    params = [nn.Parameter(torch.randn(3 + i, dtype=dtype)) for i, dtype in enumerate(dtypes)]
    grads = [torch.randn_like(p) for p in params[:3]]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    want = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    with CommDebugMode() as comms, HostReads() as reads:
        total = clip_grad_norm(params, 0.5)
    assert comms.get_total_counts() == 0 and not reads.found, reads.found
    # float32 gradients' norms are float32's: to its rounding
    assert total.dtype == torch.float64 and float(total) == pytest.approx(want, rel=1e-7)
    for p, g in zip(params, grads):
        tight = {"rtol": 1e-14, "atol": 0} if g.dtype == torch.float64 else {}
        torch.testing.assert_close(p.grad, (g.double() * 0.5 / (total + 1e-6)).to(g.dtype), **tight)
    assert params[3].grad is None
    clipped = [p.grad.clone() for p in params[:3]]
    clip_grad_norm(params, 2 * want)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, clipped))


def test_adamw_steps_with_no_host_read():
    """solo's AdamW (fused) keeps its step counts on the device: a step reads no tensor on the host (on a GPU, each
    read stalls the queue). torch's default AdamW on the CPU reads each parameter's count."""
    from solo.train.host_reads import HostReads

    for optimizer_of, reads_expected in (
        (lambda ps: build_optimizer(OPTIMIZERS.config("adamw"), [{"params": ps}], lr=0.1), False),
        (lambda ps: torch.optim.AdamW(ps, lr=0.1), True),
    ):
        model = _small_model()
        optimizer = optimizer_of(list(model.parameters()))
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        optimizer.step()
        with HostReads() as reads:
            optimizer.step()
        assert bool(reads.found) == reads_expected, reads.found


# ---------------------------------------------------------------- param_groups


def _small_model():
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=True),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )


def test_param_groups_split_weights_from_bias_and_norm():
    model = _small_model()
    conv, bn, lin = model[0], model[1], model[5]
    groups = param_groups(model, 1e-4)
    assert len(groups) == 2
    decay, no_decay = groups

    assert {id(p) for p in decay["params"]} == {id(conv.weight), id(lin.weight)}
    assert decay["weight_decay"] == 1e-4
    assert not decay.get("lars_exclude", False)

    assert {id(p) for p in no_decay["params"]} == {id(conv.bias), id(bn.weight), id(bn.bias), id(lin.bias)}
    assert no_decay["weight_decay"] == 0.0
    assert no_decay["lars_exclude"] is True

    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_param_groups_single_group_skip_frozen_and_omit_empty():
    model = _small_model()
    (group,) = param_groups(model, 1e-4, exclude_bias_and_norm=False)
    assert group["weight_decay"] == 1e-4
    assert len(group["params"]) == len(list(model.parameters()))

    model[0].weight.requires_grad_(False)
    n = sum(len(g["params"]) for g in param_groups(model, 1e-4))
    assert n == len(list(model.parameters())) - 1

    # only weights, no biases -> the no-decay group is omitted
    (only,) = param_groups(nn.Linear(3, 2, bias=False), 1e-4)
    assert only["weight_decay"] == 1e-4


# ---------------------------------------------------------------- warmup_cosine

SCHED = dict(total_steps=110, warmup_steps=10, base_lr=1.0, warmup_start_lr=0.1, final_lr=0.01)


def test_warmup_cosine_known_values():
    assert warmup_cosine(0, **SCHED) == pytest.approx(0.1)
    assert warmup_cosine(5, **SCHED) == pytest.approx(0.55)  # halfway through the linear warmup
    assert warmup_cosine(10, **SCHED) == pytest.approx(1.0)  # end of warmup
    assert warmup_cosine(60, **SCHED) == pytest.approx((1.0 + 0.01) / 2)  # halfway through the cosine
    assert warmup_cosine(110, **SCHED) == pytest.approx(0.01)  # total_steps
    assert warmup_cosine(500, **SCHED) == pytest.approx(0.01)  # past the end it stays at final_lr
    # a point a quarter into the cosine: final + (base-final) * (1 + cos(pi/4)) / 2
    assert warmup_cosine(35, **SCHED) == pytest.approx(0.01 + 0.99 * (1 + math.sqrt(0.5)) / 2)


def test_warmup_cosine_monotone():
    lrs = [warmup_cosine(s, **SCHED) for s in range(111)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # rising during warmup
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))  # strictly decreasing after


def test_warmup_cosine_matches_torch_schedulers():
    # Independent reference: torch's LinearLR followed by CosineAnnealingLR, stepped once per step.
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=10)
    for step in range(111):
        if step == 10:  # created only now: its constructor takes the current lr (1.0) as its start
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100, eta_min=0.01)
        assert warmup_cosine(step, **SCHED) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        opt.step()
        sched.step()


def test_warmup_cosine_no_warmup_and_bad_args():
    assert warmup_cosine(0, total_steps=10, warmup_steps=0, base_lr=0.3) == pytest.approx(0.3)
    assert warmup_cosine(10, total_steps=10, warmup_steps=0, base_lr=0.3) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        warmup_cosine(-1, **SCHED)
    with pytest.raises(ValueError):
        warmup_cosine(0, total_steps=5, warmup_steps=10, base_lr=1.0)


# ---------------------------------------------------------------- build_optimizer


@pytest.mark.parametrize("name, cls", [("sgd", SGD), ("lars", LARS), ("adamw", AdamW)])
def test_build_optimizer(name, cls):
    model = _small_model()
    groups = param_groups(model, 1e-4)
    own = {"sgd": {"momentum": 0.8}, "lars": {"momentum": 0.8, "eta": 0.01}, "adamw": {"betas": [0.8, 0.99]}}[name]
    opt = build_optimizer(OPTIMIZERS.config(name, weight_decay=0.5, **own), groups, lr=0.3)
    assert type(opt) is cls
    decay, no_decay = opt.param_groups
    assert decay["lr"] == no_decay["lr"] == 0.3
    # the group's own weight_decay wins over the default
    assert decay["weight_decay"] == 1e-4
    assert no_decay["weight_decay"] == 0.0
    assert no_decay["lars_exclude"] is True
    if name == "adamw":
        assert decay["betas"] == (0.8, 0.99)
    else:
        assert decay["momentum"] == 0.8
    if name == "lars":
        assert decay["eta"] == 0.01
    else:  # torch's fused kernel: float32 on the CPU has one
        assert decay["fused"] is True and not decay["foreach"]

    # the caller's group dicts are not filled in with this optimizer's defaults
    assert set(groups[0]) == {"params", "weight_decay", "lars_exclude"}

    # runs a step with the extra keys present; in eval mode every parameter has a gradient (in training mode the
    # BatchNorm after the conv takes its bias's gradient to rounding noise, which a plain SGD step may not move)
    model.eval()
    model(torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_build_optimizer_defaults_apply_to_groups_without_keys():
    p = nn.Parameter(torch.randn(3, 3))
    opt = build_optimizer(OPTIMIZERS.config("lars", weight_decay=0.2), [{"params": [p]}], lr=0.1)
    (g,) = opt.param_groups
    assert g["weight_decay"] == 0.2 and g["lars_exclude"] is False and g["eta"] == 0.02


def test_build_optimizer_unknown_name():
    with pytest.raises(ValueError) as err:
        OPTIMIZERS.config("adam")
    for name in ("sgd", "lars", "adamw"):
        assert name in str(err.value)


# ---------------------------------------------------------------- state_dict round trip


def test_lars_state_dict_round_trip_weights_only(tmp_path):
    torch.manual_seed(0)
    model = _small_model()
    x = torch.randn(4, 3, 8, 8)

    def make_opt(m):
        groups = param_groups(m, 1e-4)
        groups[1]["lr_scale"] = 0.5  # extra loop-level key must survive the checkpoint too
        return build_optimizer(OPTIMIZERS.config("lars", weight_decay=1e-4, momentum=0.9, eta=0.02), groups, lr=0.2)

    def train_step(m, opt):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()

    opt = make_opt(model)
    for _ in range(3):
        train_step(model, opt)

    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)

    resumed = _small_model()
    resumed.load_state_dict(ckpt["model"])
    resumed_opt = make_opt(resumed)
    resumed_opt.load_state_dict(ckpt["optim"])
    assert resumed_opt.param_groups[1]["lr_scale"] == 0.5
    assert resumed_opt.param_groups[1]["lars_exclude"] is True

    train_step(model, opt)
    train_step(resumed, resumed_opt)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- layer-wise lr decay and the weight-decay schedule


def test_layer_decay_scales_each_depth_as_beit():
    """timm's test ViT (6 blocks) under a head: embeddings 0.5^7, block i 0.5^(6 - i), the last norm and the head 1;
    the weight / no-weight-decay split kept inside every depth."""
    from solo.backbones import blocks_of, create_backbone
    from solo.optim import layer_decay

    torch.manual_seed(0)
    vit, width = create_backbone("test_vit", img_size=16, patch_size=4)
    model = nn.ModuleDict({"backbone": vit, "head": nn.Linear(width, 3)})
    groups = layer_decay(param_groups(model, 0.05), vit, blocks_of(vit), 0.5)
    scale = {id(p): (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["backbone.pos_embed"])] == (0.5**7, 0.05)
    assert scale[id(named["backbone.patch_embed.proj.bias"])] == (0.5**7, 0.0)
    assert scale[id(named["backbone.blocks.0.attn.qkv.weight"])] == (0.5**6, 0.05)
    assert scale[id(named["backbone.blocks.5.mlp.fc2.weight"])] == (0.5**1, 0.05)
    assert scale[id(named["backbone.norm.weight"])] == (1.0, 0.0)
    assert scale[id(named["head.weight"])] == (1.0, 0.05)
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in model.parameters())


def test_layer_decay_reaches_the_optimizer_and_needs_blocks(tmp_path):
    from solo.errors import ConfigError
    from solo.train.trainer import build_model, build_optimizer_for
    from tests.test_accumulate import CASES
    from tests.test_train import TINY, compose_cfg

    cfg = compose_cfg(CASES["mae_vit"] + ["optim.layer_decay=0.5"])  # vit_tiny cut to 2 blocks
    model = build_model(cfg, 10)
    optimizer = build_optimizer_for(model, cfg.optim, 1.0)
    scales = {g["lr_scale"] for g in optimizer.param_groups}
    assert {0.125, 0.25, 0.5, 1.0} <= scales  # embeddings, 2 blocks, the rest; the probe's own scale besides
    cfg = compose_cfg(TINY + ["optim.layer_decay=0.5", "backbone.name=resnet18", "backbone.kwargs={}"])
    build_optimizer_for(build_model(cfg, 10), cfg.optim, 1.0)  # ResNet stages are its blocks
    with pytest.raises(ConfigError, match=r"optim.layer_decay=1.5: must be in \(0, 1\]"):
        compose_cfg(TINY + ["optim.layer_decay=1.5"])


def test_layer_decay_refuses_a_backbone_without_blocks():
    from solo.errors import ConfigError
    from solo.methods import build_method
    from solo.train.trainer import PretrainModel, build_optimizer_for
    from tests.test_train import TINY, compose_cfg

    cfg = compose_cfg(TINY + ["optim.layer_decay=0.5"])
    flat = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model = PretrainModel(build_method(cfg.method, flat, 8), None)
    with pytest.raises(
        ConfigError,
        match="optim.layer_decay=0.5 scales the learning rate by depth, and the backbone "
        "Sequential has no blocks where solo looks for them",
    ):
        build_optimizer_for(model, cfg.optim, 1.0)


def test_weight_decay_follows_its_schedule_in_groups_that_decay():
    from solo.train.step import TrainStep

    weights, bias = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(1))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = weights, bias

        def forward(self, batch):
            return {"loss": (self.w.sum() + self.b.sum()) * batch["x"].sum()}

        def clipped_parameters(self):
            return self.parameters()

        def prepare_step(self, index, total_steps):
            pass

        def after_optimizer_step(self):
            pass

    model = Model()
    groups = [{"params": [weights], "weight_decay": 0.04}, {"params": [bias], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=0.1)
    schedule = [0.04, 0.1, 0.4]
    step = TrainStep(
        model,
        model,
        optimizer,
        precision="32",
        device=torch.device("cpu"),
        schedule=lambda i: 0.1,
        total_steps=3,
        weight_decay=schedule.__getitem__,
    )
    for index in range(3):
        step({"x": torch.ones(2)}, index)
        assert [g["weight_decay"] for g in optimizer.param_groups] == [schedule[index], 0.0]
    optimizer.load_state_dict(optimizer.state_dict())  # a resume: new group dicts, the same positions
    step({"x": torch.ones(2)}, 1)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars"])
@pytest.mark.parametrize("decay_as", ["number", "tensor"])
def test_the_traced_update_is_torchs_step(name, decay_as):
    """`update()`, the foreach form trainer.compile=step traces, against `step()` (torch's fused kernels): 4 steps of a
    changing learning rate (a 0-dim tensor, as the trainer gives it) on a decaying group, an excluded one and a frozen
    parameter (no gradient), float64, to 1e-12 of the weights' movement; the state (buffers, moments, step counts)
    the same too. A weight decay given as a tensor (a schedule's) the same as the number."""
    torch.manual_seed(0)

    def model():
        torch.manual_seed(0)
        return nn.ModuleDict({"w": nn.Linear(5, 4), "n": nn.LayerNorm(4), "frozen": nn.Linear(4, 2)}).double()

    config = {"sgd": SGDConfig, "adamw": AdamWConfig, "lars": LARSConfig}[name](name=name, weight_decay=0.05, lr=0.1)
    nets = [model(), model()]
    optimizers = [
        build_optimizer(config, param_groups(net, config.weight_decay, exclude_bias_and_norm=True), config.lr)
        for net in nets
    ]
    optimizers[1].make_state()
    x = torch.randn(6, 5, dtype=torch.float64)
    start = [p.detach().clone() for p in nets[0].parameters()]
    for lr in [0.1, 0.05, 0.2, 0.01]:
        for net, optimizer in zip(nets, optimizers):
            net["n"](net["w"](x)).square().sum().backward()
            for group in optimizer.param_groups:
                group["lr"] = lr
        optimizers[0].step()
        for group in optimizers[1].param_groups:  # as trainer.compile=step gives them: 0-dim tensors
            group["lr"] = torch.tensor(lr, dtype=torch.float64)
            if decay_as == "tensor":
                group["weight_decay"] = torch.tensor(float(group["weight_decay"]), dtype=torch.float64)
        optimizers[1].update()
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(nets[0].parameters(), start))
    for (key, a), b in zip(nets[0].named_parameters(), nets[1].parameters()):
        assert float((a - b).abs().max()) <= 1e-12 * moved, key
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        for field, value in optimizers[0].state[a].items():
            torch.testing.assert_close(optimizers[1].state[b][field].double(), value.double(), rtol=1e-12, atol=1e-14)
    assert not optimizers[1].state[nets[1]["frozen"].weight].get("exp_avg", torch.zeros(1)).any()
