"""trainer.compile=step: the whole training step (forward, backward, clipping, the optimizer's update, the EMA teacher)
as one graph, and the same weights as the eager step to float32's rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from solo.distributed.env import detect
from solo.errors import ConfigError
from solo.train.trainer import Trainer, pretrain
from tests.test_train import TINY, compose_cfg, weights, weights_at_init

SIMCLR = TINY + ["trainer.max_steps=3", "trainer.knn_k=0"]
# BYOL on a ResNet with BatchNorm everywhere (its views in one call, each its own statistics: row groups, in the
# student and its EMA teacher), LARS.
BYOL = SIMCLR + ["method=byol", "method.pred_hidden_dim=32"]
# DINO on a ViT with stochastic depth (drawn per sample), AdamW with a weight-decay schedule, an EMA teacher whose
# temperature and momentum follow schedules: every per-step state a compiled step must read as a tensor.
DINO = [o for o in SIMCLR if not o.startswith(("method.", "backbone."))] + [
    "method=dino",
    "backbone.name=test_vit",
    "backbone.small_stem=false",
    "+backbone.kwargs.img_size=16",
    "+backbone.kwargs.patch_size=8",
    "+backbone.kwargs.depth=2",
    "backbone.drop_path_rate=0.2",
    "method.proj_hidden_dim=16",
    "method.bottleneck_dim=8",
    "method.num_prototypes=16",
    "method.base_momentum=0.9",
    "method.use_bn_in_head=false",
    "method.warmup_teacher_temperature=0.02",
    "method.warmup_teacher_temperature_epochs=1",
    "method.freeze_last_layer_epochs=0",  # a frozen group is a constant of the graph: two graphs over a run
    "optim=adamw",
    "optim.lr=0.001",
    "optim.weight_decay=0.04",
    "optim.weight_decay_end=0.4",
]
CASES = {"byol_resnet": BYOL, "dino_vit_drop_path": DINO}


def _explained_step(case: str, tmp_path: Path, compiled: bool):
    trainer = Trainer(compose_cfg(CASES[case] + ["trainer.compile=step"]), tmp_path, detect(), torch.device("cpu"))
    step, batch = trainer.train_step, next(iter(trainer.source))
    step.compiled = compiled
    return step.explain(batch, 0)


@pytest.mark.slow
@pytest.mark.one_process
@pytest.mark.parametrize("case", list(CASES))
def test_the_step_is_one_graph(case, tmp_path):
    """torch._dynamo.explain of the step's device part: one graph, no break, for both."""
    explained = _explained_step(case, tmp_path, compiled=True)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.slow
@pytest.mark.one_process
@pytest.mark.parametrize("method", ["densecl", "lejepa"])
def test_a_step_that_reads_maps_or_draws_once_per_step_is_one_graph(method, tmp_path):
    """DenseCL (its backbone's maps, read by hooks registered when the method is built) with DSE on (its k-means++
    seeds hashed on the device from the step), and LeJEPA (its directions, hashed alike): one graph, no break. A hook
    registered in the step or a generator made there would break it (docs/performance.md: 5 and 6 graphs)."""
    settings = {"densecl": ["method.queue_size=64", "method.dse_weight=0.5"], "lejepa": []}[method]
    overrides = SIMCLR + [f"method={method}", *settings, "trainer.compile=step"]
    trainer = Trainer(compose_cfg(overrides), tmp_path, detect(), torch.device("cpu"))
    step, batch = trainer.train_step, next(iter(trainer.source))
    step.compiled = True
    explained = step.explain(batch, 0)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.slow  # 20 to 50 s of tracing: the quick suite keeps under 4 min without it
@pytest.mark.one_process
def test_the_eager_update_breaks_the_graph(tmp_path):
    """The known-wrong variant of the test above, which shows that its check finds breaks: the eager step's update
    (torch's optimizer step, which breaks the graph by design)."""
    assert _explained_step("dino_vit_drop_path", tmp_path, compiled=False).graph_break_count > 0


@pytest.mark.slow  # 35 s: six traces of a whole step
@pytest.mark.one_process
@pytest.mark.parametrize("case", list(CASES))
def test_the_step_is_traced_once_whatever_its_schedules(case, tmp_path):
    """Three steps whose learning rate, weight decay, EMA momentum, teacher temperature and drop-path draws all change:
    dynamo traces the step's device part once (what changes reaches it as tensors set in place; a number that changes
    would be a constant, and the step traced again each time). The known-wrong variant, the learning rates as numbers
    in the optimizer's groups, is traced at every step."""
    from solo.distributed import batch_sizes_remembered
    from solo.losses._checks import host_reads_deferred

    def traced(numbers: bool) -> int:
        trainer = Trainer(compose_cfg(CASES[case] + ["trainer.compile=step"]), tmp_path, detect(), torch.device("cpu"))
        step, batch = trainer.train_step, next(iter(trainer.source))
        graphs = []

        def counting(graph, inputs):
            graphs.append(graph)
            return graph.forward

        torch._dynamo.reset()
        compiled = torch.compile(step._update, backend=counting, dynamic=False)
        for index in range(3):
            frozen = step._prepare(index)
            if numbers:
                for group in step.optimizer.param_groups:
                    group["lr"] = float(group["lr"])
            with host_reads_deferred(), batch_sizes_remembered(step.batch_sizes):
                with torch._dynamo.config.patch(trace_autograd_ops=True):
                    compiled(batch, frozen)
        return len(graphs)

    assert traced(numbers=False) == 1
    assert traced(numbers=True) == 3


@pytest.mark.slow  # inductor compiles each step (about 1 and 1.5 minutes on 2 cores, its cache cold)
@pytest.mark.one_process
@pytest.mark.parametrize("case", list(CASES))
def test_a_compiled_step_gives_the_eager_steps_weights(case, tmp_path):
    """3 steps under trainer.compile=step (inductor, the CPU) give the eager steps' weights to float32's rounding:
    no farther from them than 10 times as far as the eager float32 run is from the same run in float64 (float32's
    own rounding, measured), plus 1e-4 of how far training moved the weights (inductor's CPU reductions add in
    another order than aten's). A learning rate 5% off (the known-wrong variant) is farther."""
    overrides = CASES[case]
    runs = {
        "eager": [],
        "float64": ["trainer.precision=64"],
        "compiled": ["trainer.compile=step"],
        "wrong": [f"optim.lr={1.05 * (0.001 if case.startswith('dino') else 0.3)}"],
    }
    import torch._inductor.config as inductor

    # The C++ kernels unvectorised and compiled in this process: about half inductor's compile time on 2 cores.
    with inductor.patch({"cpp.simdlen": 1, "compile_threads": 1}):
        for name, more in runs.items():
            pretrain(compose_cfg(overrides + more), tmp_path / name)
    got = {name: weights(tmp_path / name) for name in runs}
    start = weights_at_init(overrides)
    trained = [k for k in start if "running_" not in k and "temperature" not in k]

    def farthest(a: dict, b: dict) -> float:
        return max(float((a[k].double() - b[k].double()).abs().max()) for k in trained)

    moved = farthest(got["float64"], start)
    tolerance = 10 * farthest(got["eager"], got["float64"]) + 1e-4 * moved
    assert farthest(got["compiled"], got["eager"]) <= tolerance
    assert farthest(got["wrong"], got["eager"]) > tolerance


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.accumulate=2", "trainer.compile=step with trainer.accumulate=2"),
        ("trainer.precision=16", "trainer.compile=step with trainer.precision=16"),
    ],
)
def test_what_a_compiled_step_cannot_capture_is_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(SIMCLR + ["trainer.compile=step", override, "data.batch_size=16"])


def test_the_step_s_state_is_on_the_device(tmp_path):
    """The learning rates and scheduled weight decays, the step number and the EMA momentum are tensors set in place
    (their storage kept), so that a compiled step reads them as inputs, not constants."""
    trainer = Trainer(compose_cfg(DINO + ["trainer.compile=step"]), Path(tmp_path), detect(), torch.device("cpu"))
    step, method = trainer.train_step, trainer.model.method
    before = [t.data_ptr() for t in (step.scalars, step.index, method.teacher_momentum)]
    step._prepare(0)
    first = step.scalars.clone(), float(method.teacher_momentum)
    step._prepare(1)
    assert [t.data_ptr() for t in (step.scalars, step.index, method.teacher_momentum)] == before
    assert int(step.index) == 1 and not torch.equal(step.scalars, first[0])
    assert float(method.teacher_momentum) != first[1]
