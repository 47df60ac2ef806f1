"""The two towers of the image-text methods (CLIP, SigLIP), built one of two ways:

- solo's own (method.model unset): the `backbone` group's image backbone and a Transformer over UTF-8 bytes
  (solo.text), each followed by a linear projection to method.embed_dim;
- open_clip's, by model name (method.model=ViT-B-32, or any other of open_clip.list_models()): open_clip builds
  the model, whose image and text towers are used as they are, with its tokenizer (CLIP's BPE for most).

Either way the method gets the same parts (`Towers`), so its loss, evaluation and checkpoints need not know
which. open_clip's towers project to the shared space themselves, so their projections here are the identity
and the image features (what the online probe and k-NN read) are open_clip's image embedding before
normalisation, `model.encode_image(images)`.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.errors import ConfigError, NotFound, require
from solo.text import VOCAB_SIZE, ByteTokenizer, OpenCLIPTokenizer, TextTransformer


@dataclass
class Towers:
    backbone: nn.Module  # images -> image features
    feature_dim: int
    image_projection: nn.Module  # image features -> image embedding (normalised by the method)
    text_tower: nn.Module  # tokens -> text features
    text_projection: nn.Module  # text features -> text embedding (normalised by the method)
    tokenizer: ByteTokenizer | OpenCLIPTokenizer
    # What loaded weights (method.pretrained) bring besides the towers; None: the method initialises its own.
    log_logit_scale: float | None = None
    logit_bias: float | None = None


def solo_towers(backbone: nn.Module, feature_dim: int, embed_dim: int, text) -> Towers:
    """`backbone` + a projection, and solo's byte-level text Transformer (`text`: its TextConfig) + a projection."""
    image_projection = nn.Linear(feature_dim, embed_dim, bias=False)
    text_tower = TextTransformer(
        vocab_size=VOCAB_SIZE,
        context_length=text.context_length,
        width=text.width,
        depth=text.depth,
        heads=text.heads,
        causal=text.causal,
    )
    text_projection = nn.Linear(text.width, embed_dim, bias=False)
    return Towers(
        backbone, feature_dim, image_projection, text_tower, text_projection, ByteTokenizer(text.context_length)
    )


class OpenCLIPText(nn.Module):
    """open_clip's text tower: tokens -> text embedding (projected, not normalised), open_clip's own `encode_text`
    on its model, from which the image tower and the logit scale and bias were taken out (solo holds them)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens)


def open_clip_towers(name: str, overrides: dict, pretrained: str | None) -> Towers:
    """open_clip's model `name` (its config changed by `overrides`: method.model_cfg), loaded from `pretrained`
    (an open_clip state dict file or tag) or randomly initialised, taken apart into Towers."""
    open_clip = require("open_clip", "method.model (open_clip towers)", "open_clip")

    config, kwargs = open_clip_config(name, overrides), open_clip_kwargs(name, overrides)
    if "multimodal_cfg" in config:
        raise ConfigError(
            f"method.model={name} is a CoCa model, whose caption decoder a contrastive method would not "
            "train; pick a CLIP or SigLIP model of open_clip.list_models()"
        )
    if pretrained is not None:
        check_pretrained(name, pretrained)
    try:
        with quiet_open_clip():
            model = open_clip.create_model(name, pretrained=pretrained, **kwargs)
    except Exception as e:  # open_clip's errors (a config it cannot build, a state dict that does not fit) as they are
        if pretrained is not None:
            raise ConfigError(
                f"method.pretrained={pretrained}: open_clip cannot load it into method.model={name}"
                f"{_with(overrides)}: {e}"
            ) from e
        raise ConfigError(f"method.model={name}: open_clip cannot build it{_with(overrides)}: {e}") from e
    visual, scale, bias = model.visual, model.logit_scale, model.logit_bias
    del model.visual, model.logit_scale, model.logit_bias  # the image tower becomes the backbone, the scalars solo's
    with quiet_open_clip():
        tokenizer = OpenCLIPTokenizer(name, config["text_cfg"].get("context_length", 77))
    loaded = pretrained is not None
    return Towers(
        visual,
        config["embed_dim"],
        nn.Identity(),
        OpenCLIPText(model),
        nn.Identity(),
        tokenizer,
        log_logit_scale=scale.item() if loaded else None,
        logit_bias=bias.item() if loaded and bias is not None else None,
    )


def open_clip_config(name: str, overrides: dict) -> dict:
    """open_clip's config of model `name` with `overrides` merged in key by key (a nested dict changes only the
    keys it names, e.g. {"vision_cfg": {"image_size": 16}})."""
    open_clip = require("open_clip", "method.model (open_clip towers)", "open_clip")

    try:
        config = open_clip.get_model_config(name)
    except Exception as e:  # hf-hub: / local-dir: names read their config from elsewhere
        raise ConfigError(f"method.model={name}: cannot read its open_clip config: {e}") from e
    if config is None:
        matches = difflib.get_close_matches(name, open_clip.list_models(), n=5, cutoff=0.5)
        hint = f"; did you mean: {', '.join(matches)}?" if matches else ""
        raise ConfigError(
            f"method.model={name} is not an open_clip model{hint} (open_clip.list_models() lists the "
            f"{len(open_clip.list_models())} it knows)"
        )
    return _merge(config, overrides)


def open_clip_kwargs(name: str, overrides: dict) -> dict:
    """The keyword arguments that make `open_clip.create_model(name, **kwargs)` build the model of `name` changed by
    `overrides`: the merged entries of the top-level keys they touch, since open_clip replaces whole entries."""
    config = open_clip_config(name, overrides)
    return {key: config[key] for key in overrides}


def open_clip_image_size(name: str, overrides: dict) -> tuple[int, int]:
    size = open_clip_config(name, overrides)["vision_cfg"]["image_size"]
    return (size, size) if isinstance(size, int) else tuple(size)


def check_pretrained(name: str, pretrained: str) -> None:
    """`pretrained` must be a file or one of open_clip's pretrained tags for model `name`."""
    open_clip = require("open_clip", "method.model (open_clip towers)", "open_clip")

    tags = open_clip.list_pretrained_tags_by_model(name)
    if os.path.isfile(pretrained) or pretrained in tags:
        return
    shown = ", ".join(tags[:5]) + (f", ... ({len(tags) - 5} more)" if len(tags) > 5 else "")
    known = f", nor one of open_clip's tags for {name} ({shown})" if tags else ""
    raise NotFound(
        f"method.pretrained={pretrained}: no such file{known}; give an open_clip state dict (.bin, .pt or "
        f".safetensors, as open_clip.create_model({name!r}, pretrained=file) loads it)"
    )


@contextmanager
def quiet_open_clip():
    """Keep open_clip's log off solo's console: it logs each step of building a model on the root logger (INFO),
    and a WARNING for random initialisation, which is what solo asks for. Its errors still show."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def to_open_clip(state: dict[str, torch.Tensor], max_logit_scale: float | None = None) -> dict[str, torch.Tensor]:
    """An image-text method's weights with open_clip towers (its state dict keys) as open_clip's state dict.

    The logit scale goes to `logit_scale` (log space, as solo's), clamped at `max_logit_scale` as CLIP's loss uses
    it; SigLIP's bias to `logit_bias`."""
    renamed = {"backbone.": "visual.", "text_tower.model.": ""}
    out = {}
    for key, value in state.items():
        prefix = next((p for p in renamed if key.startswith(p)), None)
        if prefix is not None:
            out[renamed[prefix] + key.removeprefix(prefix)] = value
        elif key == "log_logit_scale":
            out["logit_scale"] = value.clamp(max=math.log(max_logit_scale)) if max_logit_scale else value
        elif key == "bias":
            out["logit_bias"] = value
        else:
            raise KeyError(f"{key} has no counterpart in open_clip's model: are these weights of open_clip towers?")
    return out


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        both_dicts = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merge(merged[key], value) if both_dicts else value
    return merged


def _with(overrides: dict) -> str:
    return f" with method.model_cfg={overrides}" if overrides else ""
