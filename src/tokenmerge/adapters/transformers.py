"""Diffusion transformers: SD3 / SD3.5 (MMDiT), Flux, PixArt-α/Σ and DiT.

A transformer has one token grid (the latent's patches), so every block sits at level 1 and
``max_downsample`` has no meaning there. Text tokens are never merged or downsampled:

- SD3: ``JointTransformerBlock`` — the image stream is merged around the joint attention (``attn``, whose
  processor concatenates [image; text]), SD3.5's image-only ``attn2`` and the MLP; the text stream runs as
  it is. Positions are added at the patch embedding, so merged tokens need no position of their own.
- Flux: double-stream ``FluxTransformerBlock`` as SD3 (but [text; image]); single-stream
  ``FluxSingleTransformerBlock`` concatenates [text; image] itself and runs attention and MLP in parallel
  on one normalised sequence, so its image part is merged from ``norm``'s output to ``proj_out``'s output.
  Rotary positions are applied inside the attention processor from one table shared by the batch: merged
  sequences get that table gathered at the kept positions (a merged token sits at its destination's
  position), which needs one plan for the whole batch. The grid is read from ``img_ids``.
- PixArt / DiT: ``BasicTransformerBlock``s over the patch tokens, as in a UNet's spatial transformer.
"""

from __future__ import annotations

import warnings

import torch

from .base import Argument, BlockLayout, Container, DenoiserLayout, ImageGrid, KeyValueSite, Span, basic_block, has_class_named


def _config(module: torch.nn.Module, name: str, default: int) -> int:
    config = getattr(module, "config", None)
    value = getattr(config, name, None) if config is not None else None
    return default if value is None else int(value)


def _key_value_projections(attention: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """SD3's image keys and values: ``to_k`` / ``to_v`` see only the image tokens (the text has its own
    ``add_k_proj`` / ``add_v_proj``) and only a per-token qk-norm follows, so their inputs can be downsampled."""
    projections = tuple(getattr(attention, name, None) for name in ("to_k", "to_v"))
    return projections if all(isinstance(p, torch.nn.Module) for p in projections) else ()


def _joint_block(block: torch.nn.Module) -> BlockLayout:
    spans = [Span("merge_attn", block.attn, block.attn, leave_index=0, name="attn")]
    kv = [KeyValueSite(block.attn, image_first=True, projections=_key_value_projections(block.attn))]
    if isinstance(getattr(block, "attn2", None), torch.nn.Module):
        spans.append(Span("merge_attn", block.attn2, block.attn2, name="attn2"))
        kv.append(KeyValueSite(block.attn2, image_first=True, projections=_key_value_projections(block.attn2)))
    if isinstance(getattr(block, "ff", None), torch.nn.Module):
        spans.append(Span("merge_mlp", block.ff, block.ff, name="ff"))
    return BlockLayout(block, spans, kv, kind=type(block).__name__)


def sd3_layout(module: torch.nn.Module) -> DenoiserLayout | None:
    if not has_class_named(module, "SD3Transformer2DModel", "SD3ControlNetModel"):
        return None
    blocks = [_joint_block(b) for b in getattr(module, "transformer_blocks", [])]
    grid = ImageGrid(_config(module, "patch_size", 2))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "SD3 transformer", single_level=True) if blocks else None


def _flux_double(block: torch.nn.Module) -> BlockLayout:
    spans = [
        Span("merge_attn", block.attn, block.attn, leave_index=0, rotary=(block.attn,), name="attn"),
        Span("merge_mlp", block.ff, block.ff, name="ff"),
    ]
    return BlockLayout(block, spans, [KeyValueSite(block.attn, image_first=False)], plan_shared_by_batch=True, kind=type(block).__name__)


def _flux_single(block: torch.nn.Module) -> BlockLayout:
    # Attention and MLP share one normalised [text; image] sequence: merged from norm's output to proj_out's.
    span = Span(
        "merge_attn",
        block.norm,
        block.proj_out,
        enter_on_output=True,
        enter_index=0,
        text_first=True,
        rotary=(block.attn,),
        name="attn+mlp",
    )
    return BlockLayout(
        block,
        [span],
        [KeyValueSite(block.attn, image_first=False)],
        text_name="encoder_hidden_states",
        plan_shared_by_batch=True,
        kind=type(block).__name__,
    )


class FluxGrid:
    """The (h, w) token grid of a Flux call, read from ``img_ids`` rows (0, row, col) (one host sync per
    distinct ids tensor: pipelines pass the same one at every step)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.ids = Argument(root, "img_ids")
        self.tokens = Argument(root, "hidden_states")
        self.warned = False
        self._last: tuple[tuple, tuple[int, int]] | None = None

    def __call__(self, args: tuple, kwargs: dict) -> tuple[int, int] | None:
        ids, x = self.ids(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(ids, torch.Tensor) or not isinstance(x, torch.Tensor):
            return None
        if ids.ndim == 3:
            ids = ids[0]
        key = (ids.data_ptr(), ids._version, tuple(ids.shape), str(ids.device))
        last = self._last
        if last is not None and last[0] == key:
            h, w = last[1]
        else:
            h, w = (int(v) + 1 for v in ids[:, 1:3].amax(0).tolist())
            self._last = (key, (h, w))
        if h * w != x.shape[1] or ids.shape[0] != x.shape[1]:
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"tokenmerge: Flux image tokens ({x.shape[1]}) do not form one {h}x{w} grid (reference-image tokens, "
                    "as in Kontext?); such calls run unchanged",
                    stacklevel=2,
                )
            return None
        return h, w

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False, "_last": None}


def flux_layout(module: torch.nn.Module) -> DenoiserLayout | None:
    if not has_class_named(module, "FluxTransformer2DModel", "FluxControlNetModel"):
        return None
    blocks = [_flux_double(b) for b in getattr(module, "transformer_blocks", [])]
    blocks += [_flux_single(b) for b in getattr(module, "single_transformer_blocks", [])]
    return (
        DenoiserLayout(module, [Container(module, blocks, 1, FluxGrid(module))], "Flux transformer", single_level=True) if blocks else None
    )


def patch_transformer_layout(module: torch.nn.Module) -> DenoiserLayout | None:
    """PixArt-α/Σ, DiT, and a ``Transformer2DModel`` with patched input: BasicTransformerBlocks over patches."""
    patched = has_class_named(module, "PixArtTransformer2DModel", "DiTTransformer2DModel") or (
        has_class_named(module, "Transformer2DModel") and getattr(module, "is_input_patches", False)
    )
    if not patched:
        return None
    blocks = [basic_block(b) for b in getattr(module, "transformer_blocks", []) if has_class_named(b, "BasicTransformerBlock")]
    grid = ImageGrid(_config(module, "patch_size", 2))
    return (
        DenoiserLayout(module, [Container(module, blocks, 1, grid)], f"{type(module).__name__} (patch transformer)", single_level=True)
        if blocks
        else None
    )
