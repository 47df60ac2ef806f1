"""A method's batches carry what its BatchSpec declares (solo.data.views.batch_spec): a field of its own, added from
a module outside solo (tests/toy_field_method.py, each view's crop area), reaches the method per sample as the
documented draw gives it, trains, and is exact at any world size; a random field draws from its own stream."""

import json
import random
import subprocess

import pytest
import torch

from solo.data.sampling.seeding import sample_seed
from solo.data.views.augment import PARAM_INDEX
from solo.data.views.batch_spec import BatchSpec, PatchMasks
from solo.data.views.masks import RandomMask
from solo.data.views.multiview import MultiViewDataset
from solo.data.views.transforms import ViewAugmentation, build_view_transform
from solo.train.trainer import pretrain
from tests.test_train import REPO, TINY, compose_cfg, forked, metrics, weights_at_init

TOY = [o for o in TINY if not o.startswith("method.")] + [
    "method=crop_area",
    "imports=[tests.toy_field_method]",
    f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
    "trainer.precision=64",
    "data.batch_size=8",
    "trainer.max_steps=2",
]


def test_a_method_from_its_own_module_gets_a_field_of_its_own_per_sample_and_trains(tmp_path, monkeypatch):
    from tests.toy_field_method import CropAreaRegression

    seen = []
    loss = CropAreaRegression.batch_loss
    monkeypatch.setattr(
        CropAreaRegression,
        "batch_loss",
        lambda self, encoded, batch: seen.append((batch["index"], batch["crop_area"])) or loss(self, encoded, batch),
    )
    cfg = compose_cfg(TOY)
    pretrain(cfg, tmp_path)
    losses = [m["train/loss"] for m in metrics(tmp_path) if "train/loss" in m]
    steps = [(indices, areas) for indices, areas in seen if len(indices) == 8]  # not the memory estimate's probe
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))) and len(steps) == 2
    # Each view's area, recomputed from the documented draw: view v of sample i in epoch 0 from its own generator.
    image = cfg.data.image_size
    recipes = [build_view_transform(v, image, (0.5,) * 3, (0.5,) * 3) for v in cfg.augmentation.views]
    for indices, areas in steps:
        assert areas.shape == (8, 2)
        for i, row in zip(indices.tolist(), areas):
            for v, recipe in enumerate(recipes):
                p = recipe.draw(image, image, random.Random(sample_seed(cfg.trainer.seed, 0, i, v)))
                assert float(row[v]) == pytest.approx(p[PARAM_INDEX["height"]] * p[PARAM_INDEX["width"]] / image**2)


class Blank:
    def __len__(self):
        return 12

    def __getitem__(self, index):
        return torch.zeros(3, 8, 8, dtype=torch.uint8), 0


class Draw:
    """A random field: one number per view from the generator it is given."""

    name = "draw"

    def __call__(self, params, height, width, rng):
        return torch.tensor([rng.random() for _ in range(len(params))], dtype=torch.float64)


class GlobalDraw(Draw):
    """The known-wrong field: from Python's process-wide generator, whose state depends on what was read before."""

    name = "global_draw"

    def __call__(self, params, height, width, rng):
        return torch.tensor([random.random() for _ in range(len(params))])


def test_a_random_field_draws_from_the_samples_own_stream_after_the_views_and_the_fields_before_it():
    recipe = build_view_transform(ViewAugmentation(), 8, (0.5,) * 3, (0.5,) * 3)
    fields = (PatchMasks(RandomMask(4, 0.5)), Draw(), GlobalDraw())
    data = MultiViewDataset(Blank(), [recipe, recipe], seed=3, fields=fields)
    random.seed(0)
    batch = data.__getitems__([(1, i) for i in range(12)])
    alone = data[(1, 7)]
    assert torch.equal(alone["draw"], batch[7]["draw"]) and torch.equal(alone["mask"], batch[7]["mask"])
    expected = random.Random(sample_seed(3, 1, 7, 2 + 1))  # 2 views, then field 0 (the masks), then this one
    assert alone["draw"].tolist() == [expected.random(), expected.random()]
    assert len({tuple(s["draw"].tolist()) for s in batch}) == 12
    assert not torch.equal(alone["global_draw"], batch[7]["global_draw"]), "the process-wide draw was reproducible"


def test_a_spec_without_fields_adds_nothing():
    recipe = build_view_transform(ViewAugmentation(), 8, (0.5,) * 3, (0.5,) * 3)
    sample = MultiViewDataset(Blank(), [recipe], seed=0, fields=BatchSpec().fields)[(0, 0)]
    assert sorted(sample) == ["index", "label", "skipped", "views"]


@pytest.mark.slow
def test_the_fields_method_is_exact_on_uneven_and_empty_ranks_and_its_local_mean_is_not(tmp_path):
    """2 float64 steps of 8 rows: W = 2 on [5, 3] and [8, 0] == 1 process, to 1e-10 of how far the weights moved;
    the variant that takes each rank's own mean is not, on [5, 3]."""
    wrong = [o if o != "method=crop_area" else "method=crop_area_local_mean" for o in TOY]
    jobs = {
        1: [("one", [8], TOY)],
        2: [("5-3", [5, 3], TOY), ("8-0", [8, 0], TOY), ("wrong-5-3", [5, 3], wrong)],
    }
    for world, runs in jobs.items():
        spec = [[str(tmp_path / f"{name}.pt"), layout, overrides] for name, layout, overrides in runs]
        (tmp_path / f"jobs-{world}.json").write_text(json.dumps(spec))
        launcher = forked(world)
        script = [str(REPO / "tests" / "step_layouts.py"), str(tmp_path / f"jobs-{world}.json"), "2"]
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": ""}
        proc = subprocess.run([*launcher, *script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    def load(name):
        return {k: v for k, v in torch.load(tmp_path / f"{name}.pt").items() if v.is_floating_point()}

    one, start = load("one"), weights_at_init(TOY)
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    for name in ("5-3", "8-0"):
        worst = max(float((one[k] - w).abs().max()) for k, w in load(name).items())
        assert worst <= 1e-10 * moved, f"{name}: differs by {worst} (moved {moved})"
    worst = max(float((one[k] - w).abs().max()) for k, w in load("wrong-5-3").items())
    assert worst > 1e-6 * moved, f"each rank's own mean gave the global step ({worst})"
