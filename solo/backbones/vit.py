"""Token-level access to timm's Vision Transformers, for the methods that mask patches (MAE, and the ones after it).

A timm `VisionTransformer` maps images to a pooled feature; masked-image methods need its steps apart: the patch
embeddings with their positions, the prefix tokens (class, registers), and the blocks on any subset of tokens.
These functions use the model's own modules and parameters, so a backbone trained through them is the same
`VisionTransformer` that `forward` runs, and its checkpoint loads into timm as it is.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from solo.errors import ConfigError


def check_vit(backbone: nn.Module, method: str) -> None:
    """Raise ConfigError unless `backbone` is a timm VisionTransformer whose patch size divides its image size."""
    if not is_vit(backbone):
        raise ConfigError(
            f"method={method} masks the patches of a Vision Transformer, and the backbone is a "
            f"{type(backbone).__name__}: use backbone=vit_tiny (the digits) or a timm ViT such as "
            "backbone.name=vit_base_patch16_224"
        )
    (height, width), (ph, pw) = backbone.patch_embed.img_size, backbone.patch_embed.patch_size
    if height % ph or width % pw:
        raise ConfigError(
            f"backbone.kwargs.patch_size={ph}: the patch size does not divide the image size {height} px, so the "
            f"patches would leave a border out; choose a patch size that divides {height} (or another image size)"
        )


def parts_called_apart(vit: nn.Module) -> tuple[list[nn.Module], list[nn.Parameter]]:
    """What the functions below call outside `vit`'s forward: its submodules with parameters other than the blocks
    (patch embedding, norms), and its own parameters (class and register tokens, position embeddings). FSDP2
    gathers a unit's parameters only around the unit's forward, so solo.train.distribute makes each such submodule
    a unit and keeps the own parameters, a few thousand numbers, whole on every rank."""
    modules = [m for name, m in vit.named_children() if name != "blocks" and next(m.parameters(), None) is not None]
    return modules, list(vit.parameters(recurse=False))


def is_vit(module: nn.Module) -> bool:
    from timm.models.vision_transformer import VisionTransformer  # here: timm's import slows every process's start

    return isinstance(module, VisionTransformer)


def take_empty_batches(vit: nn.Module) -> None:
    """Let `vit`'s forward take an empty batch (a rank that holds no rows this step), which timm's fails on with
    `dynamic_img_size`: such a batch goes through `output_tokens`, any other through timm's own `forward_features`.
    The instance's class becomes a subclass of its own that differs in this only, so isinstance, the checkpoint's
    keys and FSDP see timm's model."""
    vit.__class__ = _taking_empty_batches(type(vit))


@functools.cache
def _taking_empty_batches(cls: type) -> type:
    def forward_features(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return output_tokens(self, x) if len(x) == 0 else cls.forward_features(self, x, *args, **kwargs)

    return type(cls.__name__, (cls,), {"forward_features": forward_features})


def read_features_after(vit: nn.Module, blocks: int) -> None:
    """Make `vit`'s own forward (its pooled feature: the online probe's, the k-NN's, `main_linear.py`'s) read the
    tokens after its first `blocks` blocks, then its final norm and pool; the later blocks are not run there. The
    methods' losses still run every block (`run_blocks`). A next-embedding predictor without a head (NEPA) turns its
    last blocks into the prediction, so its general features lie in the middle, as iGPT found for pixels. The
    instance's class becomes a subclass of its own that differs in this only (its keys are timm's)."""
    depth = len(vit.blocks)
    if not 1 <= blocks <= depth:
        raise ConfigError(
            f"feature_blocks={blocks}: the ViT has {depth} blocks; read its features after 1 to {depth} of them"
        )
    if "feature_blocks" not in vars(vit):  # its class is changed once
        vit.__class__ = _reading_features_after(type(vit))
    vit.feature_blocks = blocks


def blocks_at(vit: nn.Module, depth: float) -> int:
    """The number of `vit`'s blocks at `depth`, a fraction of them (Method.feature_depth), at least one."""
    return max(1, round(len(vit.blocks) * depth))


def feature_blocks(vit: nn.Module) -> int:
    """How many blocks `vit`'s pooled feature runs (read_features_after): all unless told."""
    return getattr(vit, "feature_blocks", len(vit.blocks))


@functools.cache
def _reading_features_after(cls: type) -> type:
    def forward_features(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if self.feature_blocks == len(self.blocks):  # timm's own
            return cls.forward_features(self, x, attn_mask, is_causal)
        if attn_mask is not None or is_causal:  # the methods run masked attention through run_blocks
            raise ValueError("a ViT that reads its features after some blocks takes no attention mask in forward")
        return output_tokens(self, x, blocks=self.feature_blocks)

    return type(cls.__name__, (cls,), {"forward_features": forward_features})


def remove_positions(vit: nn.Module) -> None:
    """Give `vit`'s last norm a (D, D) buffer `removal` that multiplies its patch tokens (not the prefix) after the
    norm: RASA's removal of what in the tokens tells their absolute position (Franca, Venkataramanan et al., 2025),
    learnt by method=rasa and the identity until then. Every path through the norm (timm's forward, the pooled
    feature, `run_blocks`) applies it, and it travels with the backbone's weights as `norm.removal`. The norm's class
    becomes a subclass of its own that differs in this only (its other keys are timm's)."""
    norm = vit.norm
    if isinstance(norm, nn.Identity):
        raise ConfigError(
            "backbone.remove_positions=true multiplies the patch tokens after the ViT's last norm, and this ViT has "
            "none (its global pool takes an fc_norm instead): unset it or use a ViT with a final norm"
        )
    norm.__class__ = _removing_positions(type(norm))
    norm.num_prefix_tokens = vit.num_prefix_tokens
    norm.register_buffer("removal", torch.eye(vit.embed_dim))


def removes_positions(vit: nn.Module) -> bool:
    return hasattr(getattr(vit, "norm", None), "removal")


def with_nothing_removed(vit: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state`, weights of a backbone, for `vit`: where `vit` removes positions and `state` has no removal (another
    run's backbone that method=rasa starts from), the identity, which removes nothing."""
    if removes_positions(vit) and "norm.removal" not in state:
        return {**state, "norm.removal": torch.eye(vit.embed_dim, dtype=vit.norm.removal.dtype)}
    return state


class _RemovingPositions:
    def forward(self, x: torch.Tensor, keep_positions: bool = False) -> torch.Tensor:
        """`keep_positions`: the norm alone (what method=rasa learns the removal on); through forward, so that FSDP
        gathers the norm's weights around it."""
        x = super().forward(x)
        if keep_positions:
            return x
        prefix = self.num_prefix_tokens
        return torch.cat([x[:, :prefix], x[:, prefix:] @ self.removal.to(x.dtype)], dim=1)


@functools.cache
def _removing_positions(cls: type) -> type:
    return type(cls.__name__, (_RemovingPositions, cls), {})


def pool_patch_tokens(backbone: nn.Module) -> None:
    """Make a timm ViT's pooled feature the mean of its patch tokens (after the last norm) instead of its class token:
    MAE's and I-JEPA's probes read the patches."""
    if not is_vit(backbone):
        raise ConfigError(
            f"pool=mean averages a Vision Transformer's patch tokens, and the backbone is a {type(backbone).__name__}: "
            "use pool=cls (its pooled features as they are)"
        )
    backbone.global_pool = "avg"


def num_patches(vit: nn.Module) -> int:
    grid = vit.patch_embed.grid_size
    return grid[0] * grid[1]


def patch_size(vit: nn.Module) -> int:
    return vit.patch_embed.patch_size[0]


def embed_patches(
    vit: nn.Module, images: torch.Tensor, mask: torch.Tensor | None = None, mask_token: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, N, D): each patch's embedding plus its position embedding, in row-major order; no prefix tokens. With
    `mask` (B, N), the hidden patches' embeddings are `mask_token` (D,) instead (iBOT, DINOv2). Images of another size
    than the model's (local crops, `dynamic_img_size`) get its position embeddings resampled to their grid, as timm
    does."""
    x, grid = patch_contents(vit, images)
    if mask is not None:
        x = torch.where(mask[..., None], mask_token.to(x.dtype), x)
    return with_positions(vit, x, grid)


def patch_contents(vit: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B, N, D): each patch's embedding, before any position is added, in row-major order; and the patch grid."""
    x = vit.patch_embed(images)
    grid = tuple(x.shape[1:3]) if x.dim() == 4 else tuple(vit.patch_embed.grid_size)  # dynamic: (B, H, W, D)
    return x.flatten(1, -2), grid  # unlike reshape(B, -1, D), flatten takes B = 0 (an empty rank)


def with_positions(vit: nn.Module, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Patch embeddings `x` (B, N, D) of a `grid` plus the model's position embeddings, resampled to the grid when it
    is not the model's (local crops, `dynamic_img_size`) as timm does."""
    from timm.layers import resample_abs_pos_embed

    offset = 0 if vit.no_embed_class else vit.num_prefix_tokens
    positions = vit.pos_embed
    if grid != tuple(vit.patch_embed.grid_size):
        positions = resample_abs_pos_embed(positions, grid, vit.patch_embed.grid_size, num_prefix_tokens=offset)
    return x + positions[:, offset:]


def prefix_tokens(vit: nn.Module, batch: int) -> torch.Tensor:
    """(B, P, D): the class token (and register tokens) with their position embeddings where the model has them."""
    tokens = [t.expand(batch, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    if not tokens:
        return vit.pos_embed.new_zeros(batch, 0, vit.embed_dim)
    prefix = torch.cat(tokens, dim=1)
    return prefix if vit.no_embed_class else prefix + vit.pos_embed[:, : vit.num_prefix_tokens]


def run_blocks(
    vit: nn.Module,
    tokens: torch.Tensor,
    attends: torch.Tensor | None = None,
    final_norm: bool = True,
    blocks: int | None = None,
) -> torch.Tensor:
    """The transformer on `tokens` (B, L, D), prefix first: pre-norm, blocks, final norm, as timm's forward_features
    (without the final norm unless `final_norm`: CMAE's target encoder; the first `blocks` blocks only if given). With
    `attends` (B, L), only the tokens where it is True are attended to: padding that changes nothing else; with
    `attends` (B, L, L), query i attends to key j where [:, i, j] is True (AIM's prefix-causal attention)."""
    x = vit.norm_pre(tokens)
    mask = attends
    if attends is not None:  # (B, heads, queries, keys), True: attend
        mask = attends[:, None, None, :] if attends.dim() == 2 else attends[:, None]
    for block in vit.blocks[:blocks]:
        x = block(x, attn_mask=mask)
    return vit.norm(x) if final_norm else x


class BlockOutputs(nn.Module):
    """A ViT's blocks as a module of their own (data2vec's teacher, an EMA of the blocks alone): called on the tokens
    (B, L, D), it returns the outputs of its last `last` blocks. Its `blocks` are where solo.backbones.blocks_of
    looks, so FSDP shards and gathers each block as a unit (timm's own nn.Sequential of blocks, copied alone, would
    be one unit that is never called: iterated from outside, its parameters would stay sharded)."""

    def __init__(self, blocks: nn.Module):
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor, last: int) -> list[torch.Tensor]:
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index >= len(self.blocks) - last:
                outputs.append(x)
        return outputs


def output_tokens(
    vit: nn.Module,
    images: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_token: torch.Tensor | None = None,
    blocks: int | None = None,
) -> torch.Tensor:
    """(B, P + N, D): timm's `forward_features`, prefix tokens first, optionally with the masked patches' embeddings
    replaced by `mask_token` (see `embed_patches`), after the first `blocks` blocks if given. Also for an empty batch,
    on which timm's own fails with `dynamic_img_size`; `vit.forward_head` of it is the model's pooled feature."""
    patches = embed_patches(vit, images, mask, mask_token)
    return run_blocks(vit, torch.cat([prefix_tokens(vit, len(images)), patches], dim=1), blocks=blocks)


def pooled_feature(vit: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The model's pooled feature (`vit(images)`) through `output_tokens`: its blocks called one by one as the methods
    call them (FSDP's units), an empty batch allowed, as many blocks as its forward runs (read_features_after)."""
    return vit.forward_head(output_tokens(vit, images, blocks=feature_blocks(vit)))


def first_positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count): each sample's first `count` positions where `mask` (B, N) is True, in order, then the others. A
    stable sort of the mask instead of nonzero(): no host read, so the step does not wait for the device."""
    return torch.argsort((~mask).int(), dim=1, stable=True)[:, :count]


def take(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, n, D): each sample's tokens at its `positions` (B, n)."""
    return tokens.gather(1, positions[..., None].expand(-1, -1, tokens.shape[-1]))


def keep(tokens: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count, D): each sample's tokens where `mask` (B, N) is False, in order; every sample keeps `count`."""
    return take(tokens, first_positions(~mask, count))


def put_back(visible: torch.Tensor, mask: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """(B, N, D): `fill` (B, N, D), each sample's positions where `mask` (B, N) is False taken, in order, from
    `visible` (B, V, D): the inverse of `keep` (MAE's decoder input, data2vec 2.0's decoder grid)."""
    order = first_positions(~mask, visible.shape[1])
    return fill.scatter(1, order[..., None].expand(-1, -1, visible.shape[-1]), visible)


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, patch * patch * C): the pixels of each patch, row-major, channels last (MAE's order)."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def sincos_positions(dim: int, grid: tuple[int, int]) -> torch.Tensor:
    """(H * W, dim) fixed 2-D sine-cosine position embeddings (MAE's decoder): half the channels encode the row, half
    the column, each as sines and cosines of geometrically spaced frequencies."""
    if dim % 4:
        raise ConfigError(f"a 2-D sine-cosine position embedding needs a width divisible by 4, got {dim}")
    frequencies = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    rows, cols = torch.meshgrid(
        torch.arange(grid[0], dtype=torch.float64), torch.arange(grid[1], dtype=torch.float64), indexing="ij"
    )

    def encode(position: torch.Tensor) -> torch.Tensor:
        angles = position.reshape(-1, 1) * frequencies
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([encode(rows), encode(cols)], dim=1).float()


def grid_shape(vit: nn.Module) -> tuple[int, int]:
    return tuple(vit.patch_embed.grid_size)
