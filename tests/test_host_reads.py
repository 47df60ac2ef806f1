"""The training step reads no tensor's values on the host (on a GPU each read stalls the queue of kernels): every
built-in method's, counted by solo.train.host_reads.HostReads, which reports a read planted in a loss where it was
planted; the losses and the text tower that used to read, read nothing in the step."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

import solo.methods.simclr
from solo.distributed.env import process_group
from solo.losses import clip_loss, nt_xent_loss, siglip_loss, supcon_loss, wmse_loss
from solo.losses._checks import host_reads_deferred
from solo.text import VOCAB_SIZE, ByteTokenizer, TextTransformer
from solo.train.host_reads import HostReads
from solo.train.trainer import MetricsWindow, Trainer
from tests.test_strategies import CASES
from tests.test_train import compose_cfg

# The steps before the one counted: the first exchanges the ranks' batch sizes, once per shape (a read).
WARM_UP = 2
# Beyond every method's own tiny config: micro-batches (SimCLR; DINO: an EMA teacher, multi-crop, a gradient clip),
# the tiled InfoNCE losses (NT-Xent, whose excluded self-similarities fall in different tiles of 5 of its 24
# candidates; CLIP's, with its learnt scale, under micro-batches too).
OPTIONS = {
    "simclr-accumulate": CASES["simclr"] + ["trainer.accumulate=2"],
    "dino-accumulate": CASES["dino"] + ["trainer.accumulate=2"],
    "simclr-tiled": CASES["simclr"] + ["method.loss_tile=5"],
    "clip-tiled-accumulate": CASES["clip"] + ["method.loss_tile=5", "trainer.accumulate=2"],
}


@pytest.fixture(scope="module")
def group():
    with process_group() as (env, device):
        yield env, device


def epochs(source):
    """The train loader's batches as read, not yet on the device, over and over (DeepClusterV2's first epoch ends
    after 2 steps: its k-means runs there, once per epoch, and the step counted is the next epoch's first)."""
    while True:
        yield from source.loader


def reads_in_a_step(overrides: list[str], run_dir, env, device) -> HostReads:
    """The host reads of the training loop's per-step work (Trainer._fit on a step that does not log: move the
    batch, train on it, add its losses to the metrics window) at the step after WARM_UP, on a batch of 12."""
    trainer = Trainer(compose_cfg(overrides + ["data.batch_size=12"]), run_dir, env, device)
    window, batches = MetricsWindow(device), epochs(trainer.source)
    for index in range(WARM_UP + 1):
        batch = next(batches)  # loading is the data workers' work, not the step's
        with HostReads() if index == WARM_UP else nullcontext() as reads:
            batch = trainer._to_device(batch)
            window.add(trainer.train_step(batch, index), batch)
    return reads


# The one read a method's step cannot do without: torch's SVD checks on the host that it converged, and torch has no
# SVD without that check (MMCR's nuclear norms; the singular values of DSE, which the cases with method.dse_weight
# turn on).
SVD_CHECK = "torch.linalg.svd's error check"


def unavoidable(name: str) -> str | None:
    overrides = {**CASES, **OPTIONS}[name]
    takes_svd = name == "mmcr" or any(
        o.startswith("method.dse_weight=") and o != "method.dse_weight=0" for o in overrides
    )
    return SVD_CHECK if takes_svd else None


@pytest.mark.slow
@pytest.mark.one_process
@pytest.mark.parametrize("name", sorted(CASES) + list(OPTIONS))
def test_a_training_step_reads_nothing_on_the_host(name, group, tmp_path):
    reads = reads_in_a_step({**CASES, **OPTIONS}[name], tmp_path, *group)
    avoidable = [what for what, _ in reads.found if what != unavoidable(name)]
    assert not avoidable, f"{name}: {len(avoidable)} host reads in a training step:\n{reads.report()}"


def planted_loss(z1, z2, temperature, tile=None):
    loss = nt_xent_loss(z1, z2, temperature, tile=tile)
    loss.item()  # the plant
    return loss


@pytest.mark.slow
@pytest.mark.one_process
def test_a_read_planted_in_a_method_is_caught_in_the_step(group, tmp_path, monkeypatch):
    """The known-wrong step: SimCLR's loss reading its value, which the count above reports where it is."""
    monkeypatch.setattr(solo.methods.simclr, "nt_xent_loss", planted_loss)
    reads = reads_in_a_step(CASES["simclr"], tmp_path, *group)
    plant = planted_loss.__code__.co_firstlineno + 2
    assert [what for what, _ in reads.found] == ["a scalar read (.item(), bool(), int(), float())"], reads.report()
    assert reads.found[0][1].startswith(f"test_host_reads.py:{plant} <- simclr.py:"), reads.report()


# Reads planted in a loss, one per line (the line is reported), and what HostReads calls each.
PLANTS = {
    "item": (lambda z: z.sum().item(), "a scalar read (.item(), bool(), int(), float())"),
    "float": (lambda z: float(z.detach().sum()), "a scalar read (.item(), bool(), int(), float())"),
    "tolist": (lambda z: z.tolist(), ".tolist()"),
    "boolean mask": (lambda z: z[z > 0], "boolean-mask indexing (output size depends on values)"),
    "one_hot": (lambda z: F.one_hot(z.argmax(dim=1), z.shape[1]), "a scalar read (.item(), bool(), int(), float())"),
    "cholesky": (lambda z: torch.linalg.cholesky(z.T @ z), "a torch.linalg error check (use the _ex form)"),
    "tensor on the device": (
        lambda z: torch.tensor(0.5, device=z.device),
        "a tensor made from host data on the device (on a GPU a blocking copy; torch.full does not copy)",
    ),
}


def tiny_step(plant=None) -> None:
    """A forward and backward of a linear layer's features through a loss, with `plant` called on them."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3, dtype=torch.float64)
    z = layer(torch.randn(6, 4, dtype=torch.float64))
    if plant:
        plant(z)
    (z**2).mean().backward()


@pytest.mark.parametrize("kind", PLANTS)
def test_a_planted_read_is_reported_where_it_was_planted(kind):
    plant, what = PLANTS[kind]
    with HostReads() as reads:
        tiny_step(plant)
    # one_hot checks the range both ways: two reads on the line.
    assert set(reads.found) == {(what, f"test_host_reads.py:{plant.__code__.co_firstlineno}")}, reads.report()
    with HostReads() as clean:
        tiny_step()
    assert not clean.found, clean.report()


def test_reads_outside_the_block_are_not_counted():
    z = torch.ones(3)
    z.sum().item()
    with HostReads() as reads:
        (z * 2).tolist()
    z.sum().item(), z.tolist(), z[z > 0]
    assert [what for what, _ in reads.found] == [".tolist()"]


def _pairs(n=12, d=6):
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    z2 = (z1.detach() + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)).requires_grad_()
    return z1, z2


def _learnt(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64, requires_grad=True)


def _text(z1, z2):
    torch.manual_seed(0)
    tower = TextTransformer(vocab_size=VOCAB_SIZE, context_length=12, width=8, depth=1, heads=2).double()
    return tower(ByteTokenizer(12)(["a dog", "two cats", "café"])).pow(2).sum() + (z1 * z2).sum()


# What read the host in the step before (a one-hot self mask, a one-hot label matrix, a Cholesky factorisation that
# checks its errors, tiles bucketed by a bincount, the text tower's checks of its ids), forward and backward.
CHANGED = {
    "nt_xent": lambda z1, z2: nt_xent_loss(z1, z2, 0.3),
    "nt_xent tiled": lambda z1, z2: nt_xent_loss(z1, z2, 0.3, tile=5),
    "clip tiled, learnt scale": lambda z1, z2: clip_loss(
        F.normalize(z1, dim=1), F.normalize(z2, dim=1), _learnt(14.0), tile=5
    ),
    "supcon": lambda z1, z2: supcon_loss(z1, z2, torch.arange(12) % 3, 0.3),
    "siglip, learnt scale and bias": lambda z1, z2: siglip_loss(
        F.normalize(z1, dim=1), F.normalize(z2, dim=1), _learnt(10.0), _learnt(-10.0)
    ),
    "wmse": lambda z1, z2: wmse_loss(z1, z2),
    "text tower": _text,
}


@pytest.mark.parametrize("name", CHANGED)
def test_the_losses_and_text_tower_read_nothing_in_the_step(name):
    """Inside host_reads_deferred (the step's) no read, and the value the checked call gives; outside it, the value
    checks read the host (the known-wrong variant, as the step would be if it did not defer them)."""
    z1, z2 = _pairs()
    with HostReads() as checked:
        expected = CHANGED[name](z1, z2)
    with host_reads_deferred(), HostReads() as reads:
        value = CHANGED[name](z1, z2)
        value.backward()
    assert not reads.found, reads.report()
    assert torch.equal(value, expected)
    assert checked.found
