"""Real gloo process groups: the distributed losses against the single-process global-batch reference."""

import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from solo.distributed import gather
from solo.distributed.env import detect, first_host, slurm_port
from solo.errors import ConfigError
from solo.losses import LOSSES, masked_center
from solo.losses.check import TOLERANCE, _layouts, _reference, resolve, run_check, worker_context
from solo.methods import METHODS
from solo.methods.memory_banks import MomentumMemoryBank
from tests.checker_user_losses import SPECS as USER_SPECS
from tests.wrong_losses import WRONG, WRONG_SSL

pytestmark = pytest.mark.processes  # gloo process groups, the checker's and its CLI's

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# solo's own entries: the test helpers imported above register theirs in the same LOSSES.
BUILTIN = [name for name in LOSSES.names() if LOSSES[name].target.__module__.startswith("solo.")]


def test_every_methods_loss_is_registered_with_the_checker():
    methods = {m.name for m in METHODS if m.target.__module__.startswith("solo.")}
    # SimCLR's loss keeps the paper's name; methods built on another's loss use its case (All4One: its new term's).
    own_names = {
        "simclr": "nt_xent",
        "nnbyol": "byol",
        "nnsiam": "simsiam",
        "all4one": "all4one_feature",
        "dinov2": "ibot",  # and koleo; its class-token loss is dino's
        "lit": "clip",  # or siglip's
        "data2vec": "ijepa",  # masked_patch_smooth_l1
        "maskfeat": "mae",  # masked_patch_mse
        "crossmae": "mae",  # masked_patch_mse over the predicted patches
        "cmae": "mae",  # masked_patch_mse, and mocov3_loss
        "salt": "simmim",  # masked_patch_l1 (or I-JEPA's losses, method.loss)
        "densecl": "mocov2plus",  # moco_queue_loss, twice
    }
    assert {own_names.get(m, m) for m in methods} | {"koleo"} <= set(BUILTIN)
    assert all(name.removesuffix("_tiled") in set(BUILTIN) for name in BUILTIN)  # a tiled loss beside its untiled one
    assert resolve("clip").learnable == {"logit_scale": pytest.approx(1 / 0.07)}
    assert resolve("siglip").learnable == {"logit_scale": 10.0, "bias": -10.0}
    assert resolve("nt_xent").learnable == resolve("barlow_twins").learnable == resolve("dino").learnable == {}


@pytest.fixture(
    scope="module",
    params=[1, 2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],
    ids=lambda w: f"W{w}",
)
def registered_results(request):
    return run_check(BUILTIN, request.param)


def test_registered_losses_are_exact(registered_results):
    world = registered_results[0].world_size
    checked = {(r.spec, r.layout) for r in registered_results}
    assert len(checked) == len(BUILTIN) * (1 if world == 1 else 3)  # even, uneven and one rank empty
    for r in registered_results:
        assert r.loss_error <= TOLERANCE, r
        assert r.grad_error <= TOLERANCE, r


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_checker_rejects_the_popular_wrong_variants(world):
    results = run_check(WRONG, world, uneven=False)
    assert len(results) == len(WRONG)
    for r in results:
        assert not r.ok and r.grad_error > 1e-2, r
    by_name = {r.spec.split(":")[1]: r for r in results}
    # Full loss on every rank with a rank-only gather: forward right, gradient exactly 1/W of the truth.
    assert by_name["nt_xent_full_loss_rank_only_gather"].loss_error <= TOLERANCE
    assert by_name["nt_xent_full_loss_rank_only_gather"].grad_error == pytest.approx(1 - 1 / world, rel=1e-6)
    assert by_name["barlow_twins_plain_all_reduce"].grad_error == pytest.approx(1 - 1 / world, rel=1e-6)


# Each wrong variant of a self-supervised loss and the registered loss it gets wrong in a process group only.
WRONG_SSL_OF = {
    "vicreg_per_gpu_statistics": "vicreg",
    "vicreg_plain_all_reduce": "vicreg",
    "siglip_local_negatives": "siglip",
    "dino_per_gpu_centre": "dino",
    "swav_per_gpu_sinkhorn": "swav",
    "mocov3_local_keys": "mocov3",
    "byol_mean_of_rank_means": "byol",
    "supervised_mean_of_rank_means": "supervised",
    "supcon_local_views": "supcon",
    "nnclr_local_predictions": "nnclr",
    "wmse_per_rank_whitening": "wmse",
    "vibcreg_per_gpu_statistics": "vibcreg",
    "mae_mean_of_rank_means": "mae",
    "beit_mean_of_rank_means": "beit",
    "simmim_mean_of_rank_means": "simmim",
    "aim_mean_of_rank_means": "aim",
    "nepa_mean_of_rank_means": "nepa",
    "rasa_mean_of_rank_means": "rasa",
    "data2vec2_class_term_by_rank_hidden_share": "data2vec2",
    "co2_batch_local_negatives": "co2_batch",
    "swav_sinkhorn_local_batch_times_world": "swav",
    "franca_sinkhorn_local_batch_times_world": "franca",
    "koleo_per_rank_neighbours": "koleo",
    "ibot_mean_of_rank_means": "ibot",
    "gram_rank_mse": "gram",
    "paka_mean_of_rank_means": "paka",
    "ijepa_mean_of_rank_means": "ijepa",
    "deepclusterv2_mean_of_rank_means": "deepclusterv2",
    "lejepa_per_rank_statistics": "lejepa",
    "lejepa_per_rank_directions": "lejepa",
    "lejepa_mean_of_rank_means": "lejepa",
    "dcl_local_negatives": "dcl",
    "dclw_local_weights": "dclw",
    "mmcr_per_rank_nuclear_norm": "mmcr",
    "mmcr_rank_only_gather": "mmcr",
    "tico_per_rank_covariance": "tico",
    "directclr_local_negatives": "directclr",
    "align_uniform_per_rank_pairs": "align_uniform",
    "emp_ssl_per_rank_tcr": "emp_ssl",
    "frossl_per_rank_covariance": "frossl",
    "ssl_ey_per_rank_covariances": "ssl_ey",
    "capi_per_rank_sinkhorn": "capi",
    "capi_mean_of_rank_means": "capi",
    "msn_per_rank_me_max": "msn",
    "msn_mean_of_rank_means": "msn",
    "msn_per_rank_sinkhorn": "msn",
    "pmsn_per_rank_prior_matching": "pmsn",
    "detcon_local_negatives": "detcon",
    "vicregl_per_rank_local_statistics": "vicregl",
    "swav_queue_counted_on_every_rank": "swav_queue",
    "fastsiam_mean_of_rank_means": "fastsiam",
    "macl_local_negatives": "macl",
    "visreg_per_rank_statistics": "visreg",
    "pirl_mean_of_rank_means": "pirl",
    "co2_mean_of_rank_means": "co2",
    "vcreg_per_rank_statistics": "vcreg",
    "smog_per_rank_groups": "smog",
    "dse_per_rank": "dse",
}


def test_wrong_self_supervised_variants_are_right_in_one_process():
    # So that what the checker rejects below is their distribution, not another formula.
    assert sorted(spec.split(":")[1] for spec in WRONG_SSL) == sorted(WRONG_SSL_OF)
    for spec in WRONG_SSL:
        loss, grads = _reference(spec, [9], seed=0)
        right_loss, right_grads = _reference(WRONG_SSL_OF[spec.split(":")[1]], [9], seed=0)
        assert loss == pytest.approx(right_loss, rel=1e-12), spec
        for name, g in right_grads.items():
            assert abs(grads[name] - g).max() <= 1e-12 * max(abs(r).max() for r in right_grads.values()), (spec, name)


# Wrong only when the ranks hold different numbers of samples: with equal ones they give the global value.
UNEVEN_ONLY = (
    "byol_mean_of_rank_means",
    "nepa_mean_of_rank_means",
    "rasa_mean_of_rank_means",
    "supervised_mean_of_rank_means",
    "swav_sinkhorn_local_batch_times_world",
    "franca_sinkhorn_local_batch_times_world",
    "ibot_mean_of_rank_means",
    "gram_rank_mse",
    "paka_mean_of_rank_means",
    "lejepa_mean_of_rank_means",
    "msn_mean_of_rank_means",
    "fastsiam_mean_of_rank_means",
    "pirl_mean_of_rank_means",
    "co2_mean_of_rank_means",
)


@pytest.mark.slow
def test_checker_rejects_the_wrong_self_supervised_variants():
    # Equal batches and [2, 5]; with an empty rank ([5, 0]) these variants divide by zero or run alone on one rank.
    results = run_check(WRONG_SSL, 2, empty_rank=False)
    assert len(results) == 2 * len(WRONG_SSL)
    for r in results:
        name = r.spec.split(":")[1]
        if name in UNEVEN_ONLY and r.layout == (4, 4):
            assert r.ok, r  # equal-sized ranks: their means average to the global mean, B_local x W is N
        else:
            assert not r.ok and max(r.grad_error, r.loss_error) > 1e-3, r


def _gather_worker(rank, world, store, sizes, queue):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x = torch.arange(sizes[rank] * 2, dtype=torch.float64).reshape(-1, 2).add(100 * rank).requires_grad_()
    y = gather(x)
    # Rank r weighs the gathered rows by (r + 1) * row index: x's gradient must sum that over ranks.
    weights = torch.arange(y.shape[0], dtype=torch.float64)[:, None] * (rank + 1)
    (y * weights).sum().backward()
    queue.put((rank, y.detach().numpy(), x.grad.numpy()))
    dist.barrier()
    dist.destroy_process_group()


def test_gather_uneven_forward_and_reduce_scatter_backward():
    sizes = [3, 1, 2]
    world = len(sizes)
    ctx = worker_context()
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _gather_worker, args=(world, f"{tmp}/store", sizes, queue), nprocs=world, start_method="forkserver"
        )
    out = {}
    while not queue.empty():
        rank, y, grad = queue.get()
        out[rank] = (y, grad)
    expected_y = torch.cat(
        [torch.arange(s * 2, dtype=torch.float64).reshape(-1, 2) + 100 * r for r, s in enumerate(sizes)]
    )
    weight_sum = sum(r + 1 for r in range(world))  # sum over ranks of the (r + 1) factors
    offset = 0
    for rank, s in enumerate(sizes):
        y, grad = out[rank]
        assert torch.equal(torch.from_numpy(y), expected_y)
        rows = torch.arange(offset, offset + s, dtype=torch.float64)[:, None].expand(s, 2)
        assert torch.equal(torch.from_numpy(grad), rows * weight_sum)
        offset += s


def _memory_bank_worker(rank, world, store, index, rows, sizes, rank_local, queue):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)  # as the trainer builds the model: the same start on every rank
    bank = MomentumMemoryBank(8, rows.shape[1], 0.5).double()
    mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    if rank_local:  # the known-wrong variant: each rank moves the entries of its own rows only
        with torch.no_grad():
            blended = 0.5 * bank.rows[index[mine]] + 0.5 * F.normalize(rows[mine], dim=1)
            bank.rows.index_copy_(0, index[mine], F.normalize(blended, dim=1))
    else:
        bank.update(index[mine], rows[mine])
    queue.put((rank, bank.rows.numpy()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("rank_local", [pytest.param(False, marks=pytest.mark.slow), True])
def test_memory_bank_holds_the_whole_batchs_update_on_uneven_and_empty_ranks(rank_local):
    """PIRL's bank (solo.methods.memory_banks.MomentumMemoryBank) after one update from rows split [3, 0, 2] over 3
    ranks: on every rank, the bank of one process given all 5; a bank that each rank moves with its own rows only
    does not hold it (and differs between the ranks)."""
    sizes, index = [3, 0, 2], torch.tensor([6, 1, 3, 0, 5])
    rows = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    one = MomentumMemoryBank(8, 4, 0.5).double()
    one.update(index, rows)
    ctx, world = worker_context(), len(sizes)
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, f"{tmp}/store", index, rows, sizes, rank_local, queue)
        mp.start_processes(_memory_bank_worker, args=args, nprocs=world, start_method="forkserver")
    banks = dict(queue.get() for _ in range(world))
    for rank in range(world):
        same = torch.allclose(torch.from_numpy(banks[rank]), one.rows, rtol=0, atol=1e-15)
        assert same != rank_local, (rank, rank_local)


def _masked_center_worker(rank, world, store, scores, valid, sizes, queue):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    center = torch.zeros(scores.shape[1], dtype=torch.float64)
    queue.put((rank, masked_center(scores[mine], valid[mine], center, 0.5).numpy()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_masked_center_is_the_global_batch_mean_with_uneven_and_empty_ranks():
    """iBOT's patch centre over ranks of 4, 0 and 2 rows equals one process's over all 6; the mean of the ranks' own
    means (a per-rank centre, averaged as DDP would) does not."""
    scores = torch.arange(12, dtype=torch.float64).reshape(6, 2) ** 2
    valid = torch.tensor([True, True, False, True, True, False])
    sizes = [4, 0, 2]
    ctx = worker_context()
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _masked_center_worker,
            args=(len(sizes), f"{tmp}/store", scores, valid, sizes, queue),
            nprocs=len(sizes),
            start_method="forkserver",
        )
    results = [queue.get() for _ in sizes]
    expected = 0.5 * scores[valid].mean(0)
    for _, center in results:
        torch.testing.assert_close(torch.from_numpy(center), expected, rtol=1e-15, atol=0)
    per_rank = 0.5 * torch.stack([scores[:4][valid[:4]].mean(0), scores[4:][valid[4:]].mean(0)]).mean(0)
    assert (per_rank - expected).abs().max() > 1


def _run_cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "solo.losses.check", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_cli_passes_registered_and_fails_a_wrong_loss():
    good = _run_cli("--world-sizes", "2")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "all exact" in good.stdout and good.stdout.count(" ok") == 3 * len(BUILTIN)  # even, uneven, one rank empty
    bad = _run_cli("--world-sizes", "2", "--only", "--even-only", "tests.wrong_losses:barlow_twins_plain_all_reduce")
    assert bad.returncode == 1
    assert "MISMATCH" in bad.stdout and "1 mismatches" in bad.stdout


@pytest.mark.parametrize(
    "args, n_losses",
    [
        pytest.param(["nt_xent", "clip"], len(BUILTIN), marks=pytest.mark.slow),
        pytest.param(["--only", *USER_SPECS], len(USER_SPECS), marks=[pytest.mark.slow, pytest.mark.exhaustive]),
    ],
    ids=["registered", "dozen_user_losses"],
)
def test_cli_with_many_results_does_not_deadlock(args, n_losses):
    # The parent used to join the workers before reading their results: once these outgrew the pipe
    # (~64 KiB; the dozen's 96 results of ~1.7 KB do) every worker blocked in put(), the parent in join().
    run = _run_cli(*args, "--world-sizes", "4", timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all exact" in run.stdout and run.stdout.count(" ok") == 3 * n_losses


@pytest.mark.slow
def test_a_worker_that_raises_is_an_error_not_a_hang():
    run = _run_cli("--only", "tests.wrong_losses:raises_on_last_rank", "--world-sizes", "3", timeout=120)
    assert run.returncode != 0
    assert "ProcessRaisedException" in run.stderr and "boom on the last rank" in run.stderr


@pytest.mark.slow
def test_a_loss_that_needs_equal_batches_is_told_to_use_even_only():
    run = _run_cli("--only", "tests.wrong_losses:needs_equal_batches", "--world-sizes", "2", timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "uneven per-rank batches at W=2 ([2, 5] or [5, 0])" in run.stderr and "--even-only" in run.stderr
    run = _run_cli("--only", "tests.wrong_losses:needs_equal_batches", "--world-sizes", "2", "--even-only", timeout=120)
    assert run.returncode == 0 and "all exact" in run.stdout, run.stdout + run.stderr


# --- user losses with learnable scalars ------------------------------------------------------------


def test_user_loss_specs_resolve_with_their_learnable_scalars():
    assert resolve("tests.checker_user_losses:siglip").learnable == {"logit_scale": 10.0, "bias": -10.0}
    assert resolve("user_siglip").target is resolve("tests.checker_user_losses:siglip").target  # once imported
    assert resolve("tests.checker_user_losses:barlow_twins_diagonal").learnable == {}  # registered, no scalar
    assert resolve("tests.checker_user_losses:alignment").learnable == {}  # a plain function
    with pytest.raises(ConfigError, match="unknown loss 'no_such_loss'.*nt_xent.*module:function"):
        resolve("no_such_loss")


@pytest.mark.slow
def test_the_empty_rank_layout_catches_a_loss_that_fails_without_rows():
    """SwAV as it was before this layout existed (a max over the rank's rows) passes equal and uneven batches and
    fails only where a rank holds no rows: the layout every registered loss now goes through."""
    spec = "tests.wrong_losses:swav_max_of_empty_rank"
    assert all(r.ok for r in run_check([spec], 2, empty_rank=False))
    with pytest.raises(ConfigError, match=r"\[5, 0\].*a worker failed \(IndexError: amax\(\)"):
        run_check([spec], 2)


def test_a_learnable_scalar_the_loss_ignores_is_refused_before_any_worker_starts():
    with pytest.raises(ConfigError, match="does not depend on scalars.logit_scale"):
        run_check(["tests.wrong_losses:ignores_its_scalar"], 2)


SIGLIP = "tests.checker_user_losses:siglip"
SIGLIP_WRONG = ["tests.wrong_losses:siglip_bias_from_local_pairs", "tests.wrong_losses:siglip_bias_gradient_summed"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_learnable_scalar_gradients_are_checked(world):
    results = run_check([SIGLIP, "user_siglip", *SIGLIP_WRONG], world, empty_rank=False)
    by_spec = {}
    for r in results:
        by_spec.setdefault(r.spec, []).append(r)
    for r in by_spec[SIGLIP] + by_spec["user_siglip"]:  # by module:function and by registered name
        assert r.ok and set(r.param_errors) >= {"scalars.logit_scale", "scalars.bias"}, r
    # The wrong variants differ from siglip in the bias's gradient alone: the checker must blame it.
    for r in by_spec[SIGLIP_WRONG[0]] + by_spec[SIGLIP_WRONG[1]]:
        assert not r.ok and r.worst == "scalars.bias" and r.param_errors["scalars.bias"] > 1e-3, r
        assert r.loss_error <= TOLERANCE, r
        assert all(e <= TOLERANCE for name, e in r.param_errors.items() if name != "scalars.bias"), r
    # Summed instead of averaged over ranks: off by exactly (W - 1) times the true bias gradient.
    for r, layout in zip(by_spec[SIGLIP_WRONG[1]], _layouts(world, uneven=True, empty_rank=False)):
        _, grads = _reference(SIGLIP, layout, seed=0)
        scale = max(abs(g).max() for g in grads.values())
        assert r.param_errors["scalars.bias"] == pytest.approx(
            (world - 1) * abs(grads["scalars.bias"]) / scale, rel=1e-9
        )


# --- environment detection -------------------------------------------------------------------------

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_JOB_NODELIST": "gpu[012-015,020]",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
}


def test_detect_torchrun():
    e = detect(TORCHRUN)
    assert (e.rank, e.local_rank, e.world_size, e.master_addr, e.master_port, e.launcher) == (
        3,
        1,
        8,
        "node7",
        29500,
        "torchrun",
    )


def test_detect_srun_without_torchrun():
    e = detect(SLURM)
    assert (e.rank, e.local_rank, e.world_size, e.master_addr, e.launcher) == (5, 1, 8, "gpu012", "slurm")
    assert e.master_port == slurm_port("4242") == detect(SLURM).master_port  # every task derives the same port


def test_torchrun_wins_over_slurm():
    assert detect({**SLURM, **TORCHRUN}).launcher == "torchrun"


def test_plain_process_and_slurm_batch_script_are_single():
    assert detect({}).world_size == 1
    batch_step = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert detect(batch_step).launcher == "single"


def test_half_set_torchrun_environment_is_an_error():
    with pytest.raises(RuntimeError, match="WORLD_SIZE, MASTER_ADDR missing"):
        detect({"RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": "1"})


def test_half_set_slurm_environment_is_an_error():
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST"):
        detect({k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"})


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("node1", "node1"),
        ("gpu[003-005,9]", "gpu003"),
        ("a[7],b[1-2]", "a7"),
        ("cn-01,cn-02", "cn-01"),
        ("x[10-11]-ib", "x10"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_slurm_port_is_in_range_and_differs_between_jobs():
    ports = {slurm_port(str(j)) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(15000 <= p < 35000 for p in ports)


def _batchnorm_inputs(sizes, views=1):
    """`views` views of the whole batch, (views, N, 3, 4, 4), and the gradient arriving at the output."""
    g = torch.Generator().manual_seed(0)
    shape = (views, sum(sizes), 3, 4, 4)
    x = torch.randn(shape, dtype=torch.float64, generator=g) * 2 + 5  # a large mean: stability matters
    x[1:] = x[1:] * 3 - 4  # each view with statistics of its own
    upstream = torch.randn(shape, dtype=torch.float64, generator=g)
    return x, upstream


def _batchnorm_worker(rank, world, store, sizes, device, views, grouped, queue):
    from solo.distributed.batchnorm import convert_sync_batchnorm, row_groups

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x, upstream = _batchnorm_inputs(sizes, views)
    start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
    # This rank's rows of every view, the views one after the other in one call (solo.methods.base.encode_views).
    mine = x[:, start:stop].reshape(-1, *x.shape[2:]).to(device).requires_grad_()
    bn = torch.nn.Sequential(torch.nn.BatchNorm2d(3, dtype=torch.float64)).to(device)
    with torch.no_grad():
        bn[0].weight.copy_(torch.tensor([0.5, 1.0, 2.0])), bn[0].bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    bn = convert_sync_batchnorm(bn)
    # The objective is the sum over ranks of what each rank computes (solo's convention): sum(y * upstream).
    with row_groups(bn, views if grouped else 1):
        out = bn(mine)
    (out * upstream[:, start:stop].reshape(mine.shape).to(device)).sum().backward()
    grads = [bn[0].weight.grad.clone(), bn[0].bias.grad.clone()]
    for g in grads:  # the parameters' gradients are local: DDP sums them (and divides by W, as for any loss)
        dist.all_reduce(g)
    queue.put(
        (
            rank,
            type(bn[0]).__module__,
            mine.grad.view(views, -1, *x.shape[2:]).cpu().numpy(),
            [g.cpu().numpy() for g in grads],
            bn[0].running_mean.cpu().numpy(),
            bn[0].running_var.cpu().numpy(),
        )
    )
    dist.barrier()
    dist.destroy_process_group()


def _sync_batchnorm_against_one_process(device, sizes, views=1, grouped=True):
    """Every rank's gradients and running statistics against one BatchNorm called on the whole batch of each view in
    turn: None where they agree (rtol 1e-10), else what differs."""
    world = len(sizes)
    ctx = worker_context()
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _batchnorm_worker,
            args=(world, f"{tmp}/store", sizes, device, views, grouped, queue),
            nprocs=world,
            start_method="forkserver",
        )
    x, upstream = _batchnorm_inputs(sizes, views)
    x.requires_grad_()
    bn = torch.nn.BatchNorm2d(3, dtype=torch.float64)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.0, 2.0])), bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    sum((bn(x[v]) * upstream[v]).sum() for v in range(views)).backward()
    results, differs = {}, []
    while not queue.empty():
        rank, module, grad, param_grads, mean, var = queue.get()
        results[rank] = module
        start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
        if not torch.allclose(torch.from_numpy(grad), x.grad[:, start:stop], rtol=1e-10, atol=1e-12):
            differs.append(f"rank {rank}: input gradient")
        for got, want, name in zip(param_grads, (bn.weight.grad, bn.bias.grad), ("weight", "bias")):
            if not torch.allclose(torch.from_numpy(got), want, rtol=1e-10):
                differs.append(f"rank {rank}: {name} gradient")
        for got, want, name in ((mean, bn.running_mean, "running mean"), (var, bn.running_var, "running var")):
            if not torch.allclose(torch.from_numpy(got), want, rtol=1e-10):
                differs.append(f"rank {rank}: {name}")
    assert sorted(results) == list(range(world))
    return set(results.values()), differs or None


@pytest.mark.parametrize(
    "device, sizes",
    [
        pytest.param("cpu", [4, 4], marks=pytest.mark.slow),
        ("cpu", [5, 0, 2]),
        pytest.param("cuda", [4, 4], marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")),
    ],
)
def test_sync_batchnorm_equals_batchnorm_on_the_whole_batch(device, sizes):
    """W processes (uneven and empty shards included) give every rank exactly the gradient of one BatchNorm on the
    whole batch, and the same running statistics: solo's SyncBatchNorm on the CPU, torch's on a GPU (float64)."""
    modules, differs = _sync_batchnorm_against_one_process(device, sizes)
    assert differs is None, differs
    expected = "torch.nn.modules.batchnorm" if device == "cuda" else "solo.distributed.batchnorm"
    assert modules == {expected}


@pytest.mark.slow  # two launches of 3 processes: about 10 s
@pytest.mark.parametrize("sizes", [[4, 0, 2]])
def test_views_in_one_call_keep_their_own_global_statistics(sizes):
    """Two views concatenated in one call under row_groups(2) (what solo.methods.base.encode_views does with solo's
    global BatchNorm) give the gradients and running statistics of one BatchNorm called on each view's whole batch in
    turn; without the groups (one set of statistics for both views: the known-wrong way) they do not."""
    _, differs = _sync_batchnorm_against_one_process("cpu", sizes, views=2)
    assert differs is None, differs
    _, differs = _sync_batchnorm_against_one_process("cpu", sizes, views=2, grouped=False)
    assert differs and any("input gradient" in d for d in differs), differs
