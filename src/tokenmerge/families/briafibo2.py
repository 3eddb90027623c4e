"""Bria FIBO 2 (``BriaFibo2Transformer2DModel``): Z-Image's single-stream blocks over [gist; image; context images].

``BriaFibo2TransformerBlock`` is Z-Image's block (``attention`` and ``feed_forward``, each a merged span; rotary
``freqs_cis`` and the key-padding mask passed to the attention follow a merge, as in :mod:`.zimage`); the injection
blocks (``injection_layer_ids``) add a gated cross-attention (``cross_attention``) of the whole stream to their own
text bundle, a span of its own. The per-token modulation (clean context and gist tokens at t = 0) is applied outside
every span, so it never follows a merge. The Perceiver that squeezes the text into gist tokens runs as it is.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size`` 2x2, row-major; the edit's ``context_latents`` (one
  (B, C, h, w) per image, each its own size) follow the image: segments of their own, never reduced.
- text: the gist tokens. Their count is the model's own function of each prompt's length: ``encoder_hidden_states``'
  (B, bundles, T, C) T, or where ``encoder_attention_mask`` (B, T) is passed (prompts padded in a batch) its row sums
  (one host read per mask tensor; the pipeline passes the same one every step). The main ``layers`` see [gist; image;
  context] — or [image; context; gist], with a (B, S) mask, where the samples' gist counts differ — and the
  ``noise_refiner`` the image stream [image; context] alone.
- rotary: ``freqs_cis`` (1, S, D/2) complex, gathered at each sample's kept rows; the mask's columns likewise.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attention``, after the rotary embedding.
"""

from __future__ import annotations

import math

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, HostReads, Span
from .zimage import block as zimage_block


def gist_count(length: int, config: dict) -> int:
    """diffusers' ``compute_gist_count`` for one prompt of ``length`` text tokens."""
    low, high = config["gist_min_text_len"], config["gist_max_text_len"]
    smallest, largest, step = config["min_num_gist_tokens"], config["max_num_gist_tokens"], config["gist_step"]
    ratio = min(1.0, max(0.0, (float(length) - low) / (high - low)))
    quantized = math.ceil((smallest + ratio * (largest - smallest)) / step) * step
    return max(smallest, min(largest, quantized))


def block(module: torch.nn.Module, stream: str) -> BlockLayout:
    """Z-Image's block layout, plus the injection blocks' cross-attention to the text as a span of its own."""
    found = zimage_block(module, stream)
    cross = getattr(module, "cross_attention", None)
    if isinstance(cross, torch.nn.Module):
        found.spans.insert(1, Span("merge_crossattn", cross, cross, stream=stream, name="cross_attention"))
    return found


class GistLayout:
    """[gist; image; context images] (or [image; context images; gist]) of a call, from the shapes of its latents and
    the gist count its text decides."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.context = Argument(root, "hidden_states"), Argument(root, "context_latents")
        self.text, self.mask = Argument(root, "encoder_hidden_states"), Argument(root, "encoder_attention_mask")
        self.config = {name: root.config[name] for name in ("patch_size", *(k for k in root.config if "gist" in k))}
        self.reads = HostReads()

    def _grid(self, latents: torch.Tensor) -> TokenGrid:
        p = self.config["patch_size"]
        return TokenGrid((latents.shape[-2] // p, latents.shape[-1] // p), patch=(p, p))

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, text, mask = self.tokens(args, kwargs), self.text(args, kwargs), self.mask(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or not isinstance(text, torch.Tensor) or text.ndim != 4:
            return None
        if isinstance(mask, torch.Tensor):
            counts = self.reads(mask, lambda m: [gist_count(n, self.config) for n in m.sum(dim=1).tolist()])
        else:
            counts = [gist_count(text.shape[2], self.config)]
        order = ("image", "reference", "text") if min(counts) < max(counts) else ("text", "image", "reference")
        references = tuple(self._grid(c) for c in self.context(args, kwargs) or ())
        return TokenLayout.joint(order, self._grid(x), max(counts), references)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b, "image") for b in getattr(module, "noise_refiner", [])]
    blocks += [block(b, "joint") for b in getattr(module, "layers", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, GistLayout(module))], "bria-fibo-2", single_level=True)


FAMILY = Family(
    name="bria-fibo-2",
    title="Bria FIBO 2",
    timesteps=(1.0, 0.0),  # the pipeline passes t / 1000
    classes=("BriaFibo2Transformer2DModel",),
    layout=layout,
    pipelines=("BriaFibo2Pipeline",),
    cross_attention=True,
    notes="grid: hidden_states (B, C, H, W) / 2x2 patches; edit context_latents after the image, never reduced; text: the "
    "gist tokens, their count from encoder_hidden_states' length or encoder_attention_mask's row sums (one host read per "
    "mask), first (last where the samples' counts differ); main layers (joint) and noise_refiner (image) patched, "
    "injection blocks' cross_attention a span; rotary: freqs_cis (1, S, D/2) and the (B, S) mask gathered per sample",
)
