"""A wrong command line is one line: Hydra's composition errors (an unknown option, a wrong type, a value outside a
choice, a key the chosen option does not have, an unknown key) read as solo's own, `error: <key>=<value>: ...` on
stderr with exit status 2 and no traceback, through main_pretrain.py and through `solo-pretrain --nproc_per_node=2`
(which validates before it starts any worker); under torchrun only rank 0 says it. Each case is a subprocess that
imports torch (3-5 s): the cases of a test run at once."""

import os
import subprocess
import sys

import pytest

from solo.cli import unparsable
from solo.errors import ConfigError
from solo.launch import split_launcher_args
from tests.test_train import REPO, TINY

# override -> what its error line says
BAD = {
    "method=simclrr": "error: method=simclrr: method has no option simclrr; did you mean method=simclr? (the options: ",
    "trainer.max_epochs=ten": "error: trainer.max_epochs=ten: must be an integer",
    "trainer.precision=8": "error: trainer.precision=8: must be one of 32, bf16, 16, 64",
    "data.root=/x": "error: data.root=/x: data=digits has no key root (its keys: name, image_size, ",
    "+nonsense=1": "error: +nonsense=1: the config has no key nonsense (its keys: backbone, method, data, ",
}
HINT = "(SOLO_DEBUG=1 shows the traceback)"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_all(commands: dict, env: dict | None = None, timeout: int = 240) -> dict:
    """{name: argv} run at once (with `env` {name: variables} added); {name: ((stdout, stderr), exit status)}."""
    env = env or {}
    procs = {
        name: subprocess.Popen(
            argv, cwd=REPO, env={**ENV, **env.get(name, {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, argv in commands.items()
    }
    return {name: (proc.communicate(timeout=timeout), proc.returncode) for name, proc in procs.items()}


def assert_one_error_line(result, expected: str, where: str) -> None:
    (out, err), code = result
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, f"{where}: exit status {code}\n{out}\n{err}"
    assert "Traceback" not in out + err, f"{where}:\n{out}\n{err}"
    assert len(errors) == 1 and errors[0].startswith(expected), f"{where}: {errors}\n{err}"
    assert [line for line in err.splitlines() if line.strip()] in ([errors[0]], [errors[0], HINT]), f"{where}:\n{err}"


def test_hydra_errors_become_config_errors_that_name_the_override():
    """In this process (the quick suite's check): what the entry points print, before any subprocess."""
    from solo.cli import PRETRAIN, precheck
    from solo.config import register_configs

    register_configs()
    for bad, expected in BAD.items():
        with pytest.raises(ConfigError) as raised:
            precheck(PRETRAIN, [bad])
        assert f"error: {raised.value}".startswith(expected), raised.value


def test_keys_that_do_not_fit_together_are_one_line_before_anything_is_built():
    from solo.cli import PRETRAIN, precheck
    from solo.config import register_configs

    register_configs()
    for bad, message in (
        (["backbone=vit_tiny", "data.image_size=30"], "data.image_size=30 does not tile into the backbone's 4 px"),
        (
            ["backbone=vit_tiny", "backbone.kwargs.patch_size=16", "data.image_size=100"],
            r"data.image_size=100 does not tile .* 16 px patches \(backbone.kwargs.patch_size=16\): use 96 or 112",
        ),
        (
            ["backbone=vit_tiny", "method=dino", "augmentation=multicrop_digits", "backbone.kwargs.patch_size=16"],
            r"augmentation.views\[\d\].size=8 does not tile into the backbone's 16 px patches",
        ),
        (  # the decoder's width against its heads and its sine-cosine positions (was timm's AssertionError)
            ["method=mae", "method.decoder_heads=100"],
            r"method.decoder_embed_dim=\d+ with method.decoder_heads=100: .* use method.decoder_embed_dim=",
        ),
        (
            ["method=ijepa", "method.predictor_embed_dim=30", "method.predictor_heads=3"],
            r"method.predictor_embed_dim=30 with method.predictor_heads=3: .* use method.predictor_embed_dim=24",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            precheck(PRETRAIN, bad)
    precheck(PRETRAIN, ["backbone=vit_tiny", "data.image_size=32"])  # a multiple of 4: accepted


def test_a_view_that_the_augmentation_does_not_have_is_named_with_what_to_do():
    from solo.cli import PRETRAIN, precheck
    from solo.config import register_configs

    register_configs()
    crop = "augmentation.views.0.crop_scale=[0.5,1.0]"
    with pytest.raises(ConfigError) as raised:  # augmentation=auto: the method's recipe is picked when the run starts
        precheck(PRETRAIN, [crop])
    assert str(raised.value).startswith(f"{crop}: augmentation=auto writes no views out to change")
    assert f"augmentation=simclr {crop}" in str(raised.value)
    with pytest.raises(ConfigError, match=r"augmentation=simclr has 2 views \(indices 0 to 1\); there is no view 5"):
        precheck(PRETRAIN, ["augmentation=simclr", "augmentation.views.5.crop_scale=[0.5,1.0]"])
    with pytest.raises(ConfigError) as wrong_value:  # a view that exists: the value's own error
        precheck(PRETRAIN, ["augmentation=simclr", "augmentation.views.0.crop_scale=abc"])
    assert "views" not in str(wrong_value.value).split(":", 1)[1]
    precheck(PRETRAIN, ["augmentation=simclr", crop])  # the recipe named: its view changed


def test_franca_levels_past_the_backbones_width_or_the_prototypes_are_one_line():
    """Franca's coarsest level reads the backbone's width halved nesting_levels - 1 times and scores that share of
    the prototypes: a level of no features or no prototypes is named with the largest or smallest value that works."""
    from timm.models.vision_transformer import VisionTransformer

    from solo.methods.franca import Franca, FrancaConfig

    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=0)
    small = {"proj_hidden_dim": 8, "bottleneck_dim": 4}
    with pytest.raises(
        ConfigError, match=r"nesting_levels=7 halves the backbone's 32 features 6 times, to 0: use at mo"
    ):
        Franca(vit, 32, FrancaConfig(nesting_levels=7, **small))
    message = r"nesting_levels=4 gives the coarsest level \(4 of the backbone's 32 features\) none of 4 prototypes: "
    with pytest.raises(
        ConfigError, match=message + r"raise method.num_prototypes \(method.patch_prototypes\) to at least 8"
    ):
        Franca(vit, 32, FrancaConfig(nesting_levels=4, num_prototypes=64, patch_prototypes=4, **small))
    Franca(vit, 32, FrancaConfig(nesting_levels=6, num_prototypes=32, patch_prototypes=0, **small))  # 1 feature, 1


def test_another_trainer_s_device_keys_are_told_how_solo_chooses_devices():
    from solo.cli import PRETRAIN, precheck
    from solo.config import register_configs

    register_configs()
    for bad in ("trainer.accelerator=gpu", "+trainer.device=cuda", "trainer.devices=2", "+gpus=1"):
        with pytest.raises(ConfigError, match="solo has no device key: it trains on the GPUs when there are any"):
            precheck(PRETRAIN, [bad])
    with pytest.raises(ConfigError) as other:
        precheck(PRETRAIN, ["trainer.max_step=1"])
    assert "device" not in str(other.value) and "did you mean trainer.max_steps" in str(other.value)


@pytest.mark.slow  # each case a subprocess that imports torch: about 25 s of the machine's time
@pytest.mark.one_process
@pytest.mark.parametrize(
    "command",
    [["main_pretrain.py"], ["-m", "solo", "--nproc_per_node=2"]],
    ids=["main_pretrain.py", "solo-pretrain --nproc_per_node=2"],
)
def test_hydra_errors_are_one_line(command, tmp_path):
    # The launcher checks the command line with main_pretrain.py's own precheck, before it starts the workers: two
    # cases (one from Hydra's composition, one from solo's schema) show that it reports them; the script, every case.
    cases = BAD if command == ["main_pretrain.py"] else {k: BAD[k] for k in ("method=simclrr", "trainer.precision=8")}
    commands = {bad: [sys.executable, *command, bad, f"hydra.run.dir={tmp_path / 'run'}"] for bad in cases}
    if command == ["main_pretrain.py"]:
        commands["debug"] = [sys.executable, *command, "trainer.precision=8"]
    results = run_all(commands, env={"debug": {"SOLO_DEBUG": "1"}})
    for bad, expected in cases.items():
        assert_one_error_line(results[bad], expected, f"{' '.join(command)} {bad}")
    assert not (tmp_path / "run").exists(), "the config is checked before Hydra makes the run directory"
    if "debug" in results:  # SOLO_DEBUG=1 keeps the traceback
        (_, err), code = results["debug"]
        assert code != 0 and "Traceback" in err and "ConfigError" in err, err


@pytest.mark.slow
@pytest.mark.one_process
def test_main_linear_errors_are_one_line():
    result = subprocess.run(
        [sys.executable, "main_linear.py", "pretrained=x", "data=digitz"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    expected = "error: data=digitz: data has no option digitz; did you mean data=digits?"
    assert_one_error_line(((result.stdout, result.stderr), result.returncode), expected, "main_linear.py")


@pytest.mark.slow  # 2 torchrun launches of 2 workers each
@pytest.mark.processes
def test_only_rank_0_reports_under_torchrun(tmp_path):
    """One error from Hydra's composition and one from solo's checks: each worker fails, one line is printed. (Every
    case of BAD, one process each: test_hydra_errors_are_one_line.)"""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "main_pretrain.py"]
    cases = {bad: BAD[bad] for bad in ("method=simclrr", "trainer.precision=8")}
    results = run_all({bad: [*launcher, bad, f"hydra.run.dir={tmp_path / 'run'}"] for bad in cases})
    for bad, expected in cases.items():
        (out, err), code = results[bad]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code != 0 and len(errors) == 1 and errors[0].startswith(expected), f"torchrun {bad}:\n{err}"


@pytest.mark.slow  # a 2-process run of 2 steps
@pytest.mark.processes
def test_solo_pretrain_starts_the_workers(tmp_path):
    """`solo-pretrain --nproc_per_node=2` (here `python -m solo`) checks the config, then trains in 2 processes."""
    command = [sys.executable, "-m", "solo", "--nproc_per_node=2", "--standalone", *TINY]
    result = subprocess.run(
        [*command, "data.batch_size=8", "trainer.max_steps=2", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2, global batch 16" in result.stdout and (tmp_path / "checkpoints" / "last").exists()


def test_launcher_flags_are_split_from_the_command_line():
    argv = ["--nproc_per_node", "2", "method=byol", "--nnodes=1", "--standalone", "--rdzv-id=7", "--cfg", "job"]
    assert split_launcher_args(argv) == (
        ["--nproc_per_node=2", "--nnodes=1", "--standalone", "--rdzv_id=7"],
        ["method=byol", "--cfg", "job"],
    )
    assert split_launcher_args(["method=byol"]) == ([], ["method=byol"])


def test_an_unparsable_override_is_shown_quoted():
    message = unparsable("data.shards=/x/{0..1}.tar", "mismatched input '{' expecting <EOF>\nSee https://hydra.cc")
    assert message.endswith("""'data.shards="/x/{0..1}.tar"'""") and "mismatched input '{'" in message
