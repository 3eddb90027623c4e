"""NucleusMoE-Image (``NucleusMoEImageTransformer2DModel``): blocks whose image queries attend to [image; text] keys,
with an expert-choice mixture-of-experts feed-forward. Caching tokens across steps is not offered (the reason below).

``NucleusMoEImageTransformerBlock``: the image stream alone runs through each block; its attention (``attn``)
projects the image's queries, keys and values and the block's projection of the text to keys and values (the text
is not updated), and attends the image queries to the concatenated [image; text] keys. The image stream is merged
around ``attn`` and from ``pre_mlp_norm``'s output to ``img_mlp``'s: the MoE layer takes both the modulated and the
unmodulated normalised tokens (its router reads the latter), so the merge starts where both come from. Routing is
expert-choice per sample (each expert takes the top ``capacity_factor * tokens / experts`` tokens of a sample), so
merged tokens are routed as any tokens are, among fewer of them; the dense blocks' SwiGLU runs per token.

Token layout, read at the root without a host sync: ``img_shapes`` (python lists, one ``(frames, h, w)`` per sample,
as Qwen-Image's pipelines pass them: :class:`tokenmerge.families.qwenimage.ImageShapes`) gives the grid of the packed
2x2 patches of ``hidden_states``; the text, ``encoder_hidden_states.shape[1]`` tokens, comes after the image among the
keys and is never reduced. Rotary: ``image_rotary_emb = (image table (N, D/2) complex, text table)``, its element 0
gathered at each sample's kept rows; the [image; text] key mask (``attention_mask`` (B, N + T), passed when the text
has one) follows per sample. Keys and values (todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary
embedding and the grouped-query repeat.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from . import Family
from .base import BlockLayout, Container, DenoiserLayout, Follow, KeyValueSite, Span, config_int
from .qwenimage import ImageShapes

ROTARY = Follow("image_rotary_emb", dim=0, stream="image", element=0)
MASK = Follow("attention_mask", dim=-1, stream="joint")


def block(module: torch.nn.Module) -> BlockLayout:
    attn = module.attn
    spans = [
        Span("merge_attn", attn, attn, follows=((attn, ROTARY), (attn, MASK)), name="attn"),
        Span("merge_mlp", module.pre_mlp_norm, module.img_mlp, enter_on_output=True, name="pre_mlp_norm+img_mlp"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


class NucleusImageShapes(ImageShapes):
    """Qwen-Image's reading of ``img_shapes``, the text after the image (and any further segments) among the keys."""

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        found = super().__call__(args, kwargs)
        if not isinstance(found, TokenLayout):
            return found
        return TokenLayout.joint(("image", "reference", "text"), found.grid, found.text_tokens, found.references)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    reader = NucleusImageShapes(module, config_int(module, "patch_size", 2))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "nucleusmoe-image", single_level=True) if blocks else None


FAMILY = Family(
    name="nucleusmoe-image",
    title="NucleusMoE-Image",
    timesteps=(1.0, 0.0),  # the pipeline passes t / 1000
    classes=("NucleusMoEImageTransformer2DModel",),
    layout=layout,
    pipelines=("NucleusMoEImagePipeline",),
    methods=("tome", "todo", "auto"),
    unsupported="its experts each take the top share of the tokens a span gets (expert-choice routing), so a cached "
    "step's few recomputed tokens would be routed unlike the full step's",
    notes="grid: img_shapes (python lists, no host read); text: encoder_hidden_states, after the image among the keys "
    "(image queries only); rotary: element 0 of image_rotary_emb (image rows, no batch dimension), gathered at each "
    "sample's kept rows; the (B, N + T) key mask gathered per sample; expert-choice MoE routes merged tokens per sample",
)
