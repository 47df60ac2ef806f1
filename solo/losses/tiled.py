"""Row-wise log-sum-exp of scaled similarities, streamed over column tiles: memory O(n x tile), not O(n x N).

    lse[i] = log sum_j exp(s * <A[i], C[j]>)        over the N candidates j, but j != exclude[i]

is the softmax normaliser of every InfoNCE loss (NT-Xent, CLIP): local anchors A (n, D) against the
gathered candidates C (N, D). Computed naively it materialises the (n, N) logits and their gradient; here
the forward walks over tiles of `tile` candidates, keeping only a running log-sum-exp per row, and the
backward recomputes each tile's logits and turns them into softmax weights exp(logit - lse) to accumulate
dA, dC and ds tile by tile. Besides the gradients themselves (the size of A and C), the only memory is
one (n, tile) block, a buffer reused by every tile, and a few per-row vectors.

The gradient is the exact gradient of the formula above (to rounding): with g the incoming gradient of
lse and P[i, j] = exp(s <A[i], C[j]> - lse[i]) (0 on the excluded column), W = g[:, None] * P,

    dA = s * W @ C,    dC = s * W.T @ A,    ds = sum_ij W[i, j] <A[i], C[j]> = sum_i <A[i], (W @ C)[i]>.

dC is the gradient of the *gathered* candidates: when C comes from solo.distributed.gather, autograd
sends it on through gather's reduce-scatter, like the untiled losses' gradients.
"""

from __future__ import annotations

import math
import numbers

import torch

# Memory budget of the (n, tile) block for tile="auto". The tiled loss holds one such block (logits,
# then softmax weights, computed in place) plus a per-row vector or two, so bounding n x tile bounds the
# loss's own memory whatever the global batch N. 64 MiB is small next to the features themselves at the
# batch sizes where tiling matters (2 x 65,536 x 256 float32 views are 128 MiB) yet leaves each tile's
# matrix product wide enough (hundreds of columns for per-device batches up to tens of thousands of rows)
# to run at full BLAS / GPU speed; a smaller block mostly adds per-tile overhead.
TILE_BUDGET_BYTES = 64 * 2**20
# The per-row log-sum-exp is kept in float64 whatever the features' dtype (it is only n numbers): in
# float32, lse = max + log(1 + tiny) would round the tiny part away on rows dominated by their positive,
# biasing the loss lse - positive downwards (to slightly negative values on saturated rows). MPS has no
# float64: there it stays in the features' dtype.
_ROW_DTYPE = torch.float64
# Rows reduced at a time in the backward's ds = sum_i <A[i], G[i]>, so that sum needs no (n, D) temporary.
_ROW_CHUNK = 4096


def _row_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.device.type == "mps" else _ROW_DTYPE


def auto_tile(n_rows: int, n_cols: int, element_size: int, budget: int | None = None) -> int:
    """The widest tile whose (n_rows, tile) block of `element_size`-byte numbers fits in `budget` bytes
    (default TILE_BUDGET_BYTES), at least 1 column (a single column may exceed a tiny budget) and at most
    n_cols (one tile then)."""
    budget = TILE_BUDGET_BYTES if budget is None else budget
    widest = budget // max(1, n_rows * element_size)
    return max(1, min(n_cols, widest))


def config_tile(value: str) -> int | str | None:
    """A `method.loss_tile` value ("none", "auto" or a count) as the losses' `tile` argument."""
    return None if value == "none" else value if value == "auto" else int(value)


def resolve_tile(tile: int | str, n_rows: int, n_cols: int, dtype: torch.dtype) -> int:
    """A tile argument (a positive int, or "auto") -> the number of candidate columns per tile."""
    if tile == "auto":
        return auto_tile(n_rows, n_cols, torch.empty((), dtype=dtype).element_size())
    if isinstance(tile, bool) or not isinstance(tile, numbers.Integral) or tile < 1:
        raise ValueError(f"tile must be a positive int, 'auto' or None, got {tile!r}")
    return max(1, min(int(tile), n_cols))


def _exp_floor(dtype: torch.dtype) -> float:
    """The smallest argument whose exp is a normal number of `dtype` (-87 in float32, -708 in float64).

    Shifted logits are clamped there before exp: below it exp underflows through denormals to 0, which
    CPU exp kernels compute many times slower (docs/performance.md). The clamped terms weigh at most
    exp(floor) ~ 1e-38 (float32) against a row total of at least 1 (its largest term is exp(0)), far below rounding.
    """
    return float(math.ceil(math.log(torch.finfo(dtype).tiny)))


def _set_excluded(block: torch.Tensor, exclude: torch.Tensor, start: int, value: float) -> None:
    """block[i, exclude[i] - start] = value for every row i whose excluded column lies in this tile (the block's
    columns are candidates start, start + 1, ...), in place and on the device: which rows that is depends on the
    values of `exclude`, so every row's entry at its (clamped) column is written, its own value kept where its
    excluded column lies in another tile. O(n) memory, no (n, tile) mask, and no host read (on a GPU, a sync)."""
    width = block.shape[1]
    column = (exclude - start).clamp_(0, width - 1)[:, None]
    inside = ((exclude >= start) & (exclude < start + width))[:, None]
    block.scatter_(1, column, torch.where(inside, value, block.gather(1, column)))


def _block(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous (rows, cols) view at the start of the flat reusable buffer."""
    return buffer[: rows * cols].view(rows, cols)


class _TiledLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchors, candidates, scale, tile, exclude):
        with torch.autocast(anchors.device.type, enabled=False):
            a = anchors.contiguous()
            # One tensor for both (NT-Xent in one process): the backward then sums dA and dC in one buffer.
            shared = candidates is anchors
            c = a if shared else candidates.contiguous()
            n, total = a.shape[0], c.shape[0]
            buffer = a.new_empty(n * min(tile, total))
            row_dtype = _row_dtype(a)
            lse = a.new_full((n,), float("-inf"), dtype=row_dtype)
            floor = _exp_floor(a.dtype)
            for start in range(0, total, tile):
                width = min(tile, total - start)
                logits = _block(buffer, n, width)
                # Scaling the (width, D) candidate tile is cheaper than scaling the (n, width) logits.
                torch.mm(a, (c[start : start + width] * scale).T, out=logits)
                if exclude is not None:
                    _set_excluded(logits, exclude, start, float("-inf"))  # out of the row's maximum
                # Online log-sum-exp: this tile's, by max-shift, merged into the running one. A row whose
                # only column here is excluded has max -inf: shifted by 0 instead, its sum is 0, lse -inf.
                peak = logits.amax(dim=1)
                peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
                logits.sub_(peak[:, None]).clamp_(min=floor).exp_()
                if exclude is not None:
                    _set_excluded(logits, exclude, start, 0.0)  # exactly out of the sum, not exp(floor)
                tile_sum = logits.sum(dim=1)
                lse = torch.logaddexp(lse, tile_sum.to(row_dtype).log_().add_(peak))
        ctx.tile, ctx.shared = tile, shared
        ctx.save_for_backward(a, c, scale, lse, exclude)
        return lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lse):
        a, c, scale, lse, exclude = ctx.saved_tensors
        need_a, need_c, need_s = ctx.needs_input_grad[:3]
        tile = ctx.tile
        n, total = a.shape[0], c.shape[0]
        with torch.autocast(a.device.type, enabled=False):
            # exp(logit - lse) = exp(logit - m) * exp(-(lse - m)), m = lse rounded to the logits' dtype:
            # logit - m is exact near the top logits, and the row's residual goes into its factor g.
            lse_rounded = lse.to(a.dtype)
            row_factor = (grad_lse.to(lse.dtype) * torch.exp(lse_rounded.to(lse.dtype) - lse)).to(a.dtype)
            buffer = a.new_empty(n * min(tile, total))
            floor = _exp_floor(a.dtype)
            # G = W @ C, accumulated over tiles: dA = s * G and ds = sum_i <A[i], G[i]>. With A and C one
            # tensor, its whole gradient s * (G + W.T @ A) accumulates in G: no second (N, D) buffer and
            # no sum of two by autograd; ds is then half of sum_i <A[i], G[i]> (both terms give ds).
            shared = ctx.shared
            g_acc = a.new_zeros(a.shape) if (need_a or need_s or (shared and need_c)) else None
            grad_c = a.new_empty(c.shape) if need_c and not shared else None
            for start in range(0, total, tile):
                width = min(tile, total - start)
                c_tile = c[start : start + width]
                weights = _block(buffer, n, width)
                torch.mm(a, (c_tile * scale).T, out=weights)  # the forward's logits, recomputed
                # Softmax weights times the incoming gradient, in place: W = g * exp(logits - lse).
                weights.sub_(lse_rounded[:, None]).clamp_(min=floor).exp_().mul_(row_factor[:, None])
                if exclude is not None:
                    _set_excluded(weights, exclude, start, 0.0)
                if g_acc is not None:
                    g_acc.addmm_(weights, c_tile)
                if shared:
                    g_acc[start : start + width].addmm_(weights.T, a)
                elif grad_c is not None:
                    torch.mm(weights.T, a, out=grad_c[start : start + width])
            if grad_c is not None:
                grad_c.mul_(scale)
            grad_s = None
            if need_s:
                # Started from a device zero: a rank with no rows gives one without a host-to-device copy.
                chunks = ((a[i : i + _ROW_CHUNK] * g_acc[i : i + _ROW_CHUNK]).sum() for i in range(0, n, _ROW_CHUNK))
                grad_s = sum(chunks, a.new_zeros(()))
                grad_s = (grad_s / 2 if shared else grad_s).reshape(scale.shape)
            grad_a = g_acc.mul_(scale) if (need_a or (shared and need_c)) else None
        # Shared: grad_a is already the whole gradient of the one tensor (autograd adds None as zero).
        return grad_a, None if shared else grad_c, grad_s, None, None


def tiled_logsumexp(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    scale: float | torch.Tensor,
    tile: int | str,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """lse[i] = log sum_{j != exclude[i]} exp(scale * <anchors[i], candidates[j]>), shape (n,), float64.

    anchors (n, D) and candidates (N, D) share a floating dtype; `scale` is a python number or a 0-dim
    tensor, which may require grad; `tile` is the number of candidates per tile (a positive int, clipped
    to N, or "auto": see TILE_BUDGET_BYTES); `exclude` (n,) optionally names one candidate per row to
    leave out (NT-Xent's self-similarity; it counts as a logit of -inf). Every row must keep at least one
    candidate. Differentiable in anchors, candidates and scale, without an (n, N) matrix either way.
    """
    if anchors.dim() != 2 or candidates.dim() != 2 or anchors.shape[1] != candidates.shape[1]:
        raise ValueError(
            f"anchors and candidates must be (n, D) and (N, D), got {tuple(anchors.shape)} and {tuple(candidates.shape)}"
        )
    if anchors.dtype != candidates.dtype or not anchors.is_floating_point():
        raise TypeError(
            f"anchors and candidates must share a floating dtype, got {anchors.dtype} and {candidates.dtype}"
        )
    if candidates.shape[0] == 0:
        raise ValueError("no candidates: the log-sum-exp of an empty set is -inf")
    tile = resolve_tile(tile, anchors.shape[0], candidates.shape[0], anchors.dtype)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale must be a number or a 1-element tensor, got shape {tuple(scale.shape)}")
        scale = scale.reshape(()).to(anchors.dtype)  # differentiable: the gradient returns in scale's dtype
    else:
        # torch.full, not torch.tensor: on a GPU, torch.tensor copies from the host and waits for the queue.
        scale = torch.full((), float(scale), dtype=anchors.dtype, device=anchors.device)
    if exclude is not None:
        exclude = exclude.to(device=anchors.device, dtype=torch.long)
        if exclude.shape != (anchors.shape[0],):
            raise ValueError(
                f"exclude must hold one column per anchor, shape ({anchors.shape[0]},), got {tuple(exclude.shape)}"
            )
    return _TiledLogSumExp.apply(anchors, candidates, scale, tile, exclude)
