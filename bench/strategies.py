"""FSDP against DDP, and bf16 against float32, on the CPU: solo's own Trainer (its model, trainer.strategy, optimizer
and TrainStep) stepping SimCLR on a timm ViT with in-memory images, one torchrun launch per configuration.

    python bench/strategies.py memory [--model vit_large_patch16_224] [--worlds 1 2 4] [--strategies ddp fsdp]
    python bench/strategies.py time [--model vit_base_patch16_224] [--world 2] [--batch 2] [--steps 4]
    python bench/strategies.py precision [--model vit_base_patch16_224] [--batch 4] [--steps 4]

memory: what each rank holds after one AdamW step, counted tensor by tensor (FSDP's shards by their local part):
parameters, gradients (at the optimizer step, before they are freed), optimizer state; and the peak: the process's
resident memory on the CPU, the device's allocated memory on a GPU.
time: seconds per step (the mean after one warm-up step) under each strategy at the same W and batch per rank.
precision: the same at W = 1 in float32 and in bf16 (autocast).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(world: int, args: list[str]) -> list[dict]:
    """Run this file's worker on `world` processes; every rank's report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--standalone", __file__]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
        proc = subprocess.run(
            [*cmd, "--worker", "--out", str(out), *args], cwd=REPO, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"worker failed ({' '.join(args)}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def worker(a) -> None:
    import torch
    import torch.distributed as dist
    from hydra import compose, initialize_config_dir
    from torch.distributed.tensor import DTensor

    from solo.config import register_configs, validate_pretrain
    from solo.distributed.env import process_group
    from solo.train.trainer import Trainer

    register_configs()
    overrides = [
        "method=simclr",
        "data=synthetic",
        f"data.image_size={a.image_size}",
        "data.num_samples=64",
        "data.num_workers=0",
        f"data.batch_size={a.batch}",
        "backbone=resnet18",
        f"backbone.name={a.model}",
        "backbone.small_stem=false",
        "optim=adamw",
        f"trainer.strategy={a.strategy}",
        f"trainer.precision={a.precision}",
        "trainer.progress_bar=false",
    ]
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = validate_pretrain(compose("pretrain", overrides=overrides))

    def held(tensors) -> int:
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local)

    with process_group() as (env, device), tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), env, device)
        model, optimizer = trainer.model, trainer.train_step.optimizer
        grads = {}
        optimizer.register_step_post_hook(
            lambda *_: grads.update(bytes=held(p.grad for p in model.parameters() if p.grad is not None))
        )
        g = torch.Generator().manual_seed(env.rank)
        batch = {
            "views": [torch.randn(a.batch, 3, a.image_size, a.image_size, generator=g) for _ in range(2)],
            "label": torch.randint(0, 10, (a.batch,), generator=g),
        }
        batch = trainer._to_device(batch)
        seconds = []
        for index in range(a.steps + 1):
            start = time.perf_counter()
            trainer.train_step(batch, index)
            dist.barrier() if dist.is_initialized() else None
            seconds.append(time.perf_counter() - start)
        state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        report = {
            "rank": env.rank,
            "parameters": held(model.parameters()),
            "gradients": grads["bytes"],
            "optimizer": held(state),
            # On a GPU the device's peak allocation, on the CPU the process's peak resident memory.
            "peak": torch.cuda.max_memory_allocated(device)
            if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "step_s": sum(seconds[1:]) / a.steps,
        }
        reports = [None] * env.world_size
        if dist.is_initialized():
            dist.all_gather_object(reports, report)
        else:
            reports = [report]
        if env.is_main:
            Path(a.out).write_text(json.dumps(reports))


GB = 1e9


def memory(a) -> None:
    print(f"{a.model}, SimCLR, AdamW, float32, {a.image_size} px, batch 2 per rank; GB per rank (rank 0)")
    print("| strategy | W | parameters | gradients | optimizer state | sum | peak (RSS, or GPU allocated) |")
    print("|---|---|---|---|---|---|---|")
    for strategy in a.strategies:
        for world in a.worlds:
            r = launch(world, [*common(a, strategy, "32"), "--batch", "2", "--steps", "1"])[0]
            total = r["parameters"] + r["gradients"] + r["optimizer"]
            cells = [r["parameters"], r["gradients"], r["optimizer"], total, r["peak"]]
            print(f"| {strategy} | {world} | " + " | ".join(f"{c / GB:.2f}" for c in cells) + " |", flush=True)


def timing(a) -> None:
    print(f"{a.model}, SimCLR, AdamW, float32, {a.image_size} px, batch {a.batch} per rank, W = {a.world}")
    steps = {s: launch(a.world, [*common(a, s, "32"), *sizes(a)])[0]["step_s"] for s in ("ddp", "fsdp")}
    print("| strategy | s/step | / DDP |\n|---|---|---|")
    for s, t in steps.items():
        print(f"| {s} | {t:.2f} | {t / steps['ddp']:.2f} |")


def precision(a) -> None:
    print(f"{a.model}, SimCLR, AdamW, {a.image_size} px, batch {a.batch}, one process")
    steps = {p: launch(1, [*common(a, "ddp", p), *sizes(a)])[0]["step_s"] for p in ("32", "bf16")}
    print("| precision | s/step | / float32 |\n|---|---|---|")
    for p, t in steps.items():
        print(f"| {p} | {t:.2f} | {t / steps['32']:.2f} |")


def common(a, strategy: str, precision: str) -> list[str]:
    return ["--model", a.model, "--image-size", str(a.image_size), "--strategy", strategy, "--precision", precision]


def sizes(a) -> list[str]:
    return ["--batch", str(a.batch), "--steps", str(a.steps)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", choices=["memory", "time", "precision"], default="memory")
    p.add_argument("--model", default=None)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--precision", default="32", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    a.model = a.model or ("vit_large_patch16_224" if a.what == "memory" else "vit_base_patch16_224")
    {"memory": memory, "time": timing, "precision": precision}[a.what](a)


if __name__ == "__main__":
    main()
