#!/usr/bin/env python
"""Peak memory and time of the contrastive losses, tiled and untiled: forward + backward in one process.

    python bench/loss_memory.py                                   # CPU; N = 1024 4096 16384 65536, D = 256
    python bench/loss_memory.py --sizes 1024 4096 --tile 512      # a fixed tile instead of "auto"
    python bench/loss_memory.py --device cuda --sizes 4096 65536 262144

N is the global batch in pairs, all in this one process (as on one rank of W with B_local = N / W, the
loss's memory is that of B_local anchors against N candidates). For each N and loss (nt_xent: 2N views
against 2N; clip: N images against N texts and back, learnable logit scale), each measurement runs in a
fresh subprocess: it makes the features (unit vectors, positives correlated), runs one tiny step of the
same path so that kernels and thread pools exist, then takes its baseline and times `--repeats` steps
(forward + backward into the features and the scale; the best time is reported). Peak memory is the
increase over that baseline: on CPU the peak resident set size (VmHWM, reset after the baseline where
Linux allows it, else getrusage's ru_maxrss), on CUDA torch.cuda.max_memory_allocated. It therefore
includes what any step holds besides the logits: normalised copies of the features and their gradients.

The untiled loss is skipped where its estimated memory (a measured number of bytes per logit, times the
logits) exceeds --limit-gb. Time per sample is the step's time over N; the last column is the tiled
step's time over the untiled one at the same N and loss.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # solo, from a checkout too

# Peak bytes per logit of one untiled forward + backward, as this script measured them on CPU in float32
# (about 13.6 and 9.8 at N = 4096), rounded up: NT-Xent's (2N, 2N) logits, masked copy, self mask and
# log-softmax, then their gradients; CLIP's two (N, N) matrices, their log-softmax and gradients.
UNTILED_BYTES_PER_LOGIT = {"nt_xent": 14, "clip": 10}
LOGITS = {"nt_xent": lambda n: (2 * n) ** 2, "clip": lambda n: 2 * n * n}


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _reset_peak_rss() -> bool:
    """Reset the peak RSS to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _worker(spec: dict) -> dict:
    import torch

    from solo.losses import clip_loss, nt_xent_loss

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    n, dim, tile = spec["n"], spec["dim"], spec["tile"]

    def features(rows: int, seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        z1 = torch.randn(rows, dim, generator=g, device=device)
        z2 = torch.randn(rows, dim, generator=g, device=device).mul_(0.7).add_(z1)
        for z in (z1, z2):  # in place: no temporary above the baseline's high-water mark
            z.div_(z.norm(dim=1, keepdim=True))
        return z1.requires_grad_(), z2.requires_grad_()

    scale = torch.tensor(1 / 0.07, device=device, requires_grad=True)

    def step(z1, z2):
        for p in (z1, z2, scale):
            p.grad = None
        if spec["loss"] == "nt_xent":
            loss = nt_xent_loss(z1, z2, 0.1, tile=tile)
        else:
            loss = clip_loss(z1, z2, scale, tile=tile)
        loss.backward()
        return float(loss)

    step(*features(64, 1))  # warm-up: kernels, thread pools, allocator
    z1, z2 = features(n, 0)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        _reset_peak_rss()  # where it cannot, the baseline is the high-water mark so far
        base = _peak_rss_bytes()
    times = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        value = step(z1, z2)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _peak_rss_bytes()
    return {"peak_mib": (peak - base) / 2**20, "ms": 1e3 * min(times), "loss_value": value}


def _resolved_tile(loss: str, n: int, tile) -> int | None:
    if tile is None:
        return None
    from solo.losses.tiled import resolve_tile

    rows = cols = 2 * n if loss == "nt_xent" else n
    return resolve_tile(tile, rows, cols, __import__("torch").float32)


def _measure(spec: dict) -> dict:
    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if run.returncode != 0:
        return {"error": (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def _repeats(n: int, requested: int | None) -> int:
    if requested:
        return requested
    return 3 if n <= 4096 else 2 if n <= 16384 else 1  # fewer at large N: a step there takes minutes on a CPU


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536], help="global batches N (pairs)"
    )
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--tile", default="auto", help='"auto" (the default) or a number of candidates per tile')
    parser.add_argument("--losses", nargs="+", default=["nt_xent", "clip"], choices=["nt_xent", "clip"])
    parser.add_argument("--paths", nargs="+", default=["untiled", "tiled"], choices=["untiled", "tiled"])
    parser.add_argument("--limit-gb", type=float, default=8.0, help="skip the untiled loss above this estimated memory")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per measurement (default: 3, 2, 1 by N)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each measurement (default: torch's)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    tile = args.tile if args.tile == "auto" else int(args.tile)

    import torch

    print(
        f"# device {args.device}, D = {args.dim}, float32, torch {torch.__version__}, "
        f"{args.threads or torch.get_num_threads()} threads, tile {args.tile}, untiled up to ~{args.limit_gb:g} GB"
    )
    header = (
        f"{'N':>7}  {'loss':<8} {'path':<16} {'peak MiB':>9} {'ms/step':>10} {'us/sample':>10} {'tiled/untiled':>13}"
    )
    print(header)
    print("-" * len(header), flush=True)
    started = time.perf_counter()
    for n in args.sizes:
        for loss in args.losses:
            untiled_ms = None
            for path_tile in [None] * ("untiled" in args.paths) + [tile] * ("tiled" in args.paths):
                label = "untiled" if path_tile is None else f"tiled ({_resolved_tile(loss, n, path_tile)})"
                if path_tile is None:
                    estimate = UNTILED_BYTES_PER_LOGIT[loss] * LOGITS[loss](n)
                    if estimate > args.limit_gb * 1e9:
                        skipped = f"{'-':>9} {'-':>10} {'-':>10} {'-':>13}  skipped: needs ~{estimate / 1e9:.0f} GB"
                        print(f"{n:>7}  {loss:<8} {label:<16} {skipped}", flush=True)
                        continue
                spec = {
                    "device": args.device,
                    "n": n,
                    "dim": args.dim,
                    "tile": path_tile,
                    "loss": loss,
                    "repeats": _repeats(n, args.repeats),
                    "threads": args.threads,
                }
                r = _measure(spec)
                if "error" in r:
                    print(f"{n:>7}  {loss:<8} {label:<16} failed: {r['error']}", flush=True)
                    continue
                ratio = ""
                if path_tile is None:
                    untiled_ms = r["ms"]
                elif untiled_ms:
                    ratio = f"{r['ms'] / untiled_ms:.2f}"
                print(
                    f"{n:>7}  {loss:<8} {label:<16} {r['peak_mib']:>9.0f} {r['ms']:>10.1f} {1e3 * r['ms'] / n:>10.2f} {ratio:>13}",
                    flush=True,
                )
    print(f"# total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
