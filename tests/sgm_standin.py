"""A stand-in for ``sgm`` (SDXL's original code, which does not install from PyPI).

It mirrors what tokenmerge meets in sgm: ``BasicTransformerBlock.forward(x, context=None,
additional_tokens=None, n_times_crossframe_attn_in_self=0)`` running ``_forward`` through a checkpoint,
attention modules taking ``additional_tokens`` (prepended to the sequence and cut off the output), and a
UNet shaped like SDXL's: no attention at the top level, transformers at downsampling 2 and 4. The UNet,
SpatialTransformer, attention and feed-forward layers are ldm's (sgm's are their descendants); only the
sgm signatures are added here.
"""

from __future__ import annotations

import torch
from ldm.modules.attention import CrossAttention as LdmCrossAttention
from ldm.modules.diffusionmodules.openaimodel import UNetModel
from ldm.modules.diffusionmodules.util import checkpoint

from conftest import reinit_zeroed


class CrossAttention(LdmCrossAttention):
    def forward(self, x, context=None, mask=None, additional_tokens=None, n_times_crossframe_attn_in_self=0):
        if n_times_crossframe_attn_in_self:
            raise NotImplementedError("cross-frame attention is for sgm's video models")
        n_extra = 0
        if additional_tokens is not None:
            n_extra = additional_tokens.shape[1]
            x = torch.cat([additional_tokens, x], dim=1)
        out = super().forward(x, context=context, mask=mask)
        return out[:, n_extra:]


class BasicTransformerBlock(torch.nn.Module):
    """sgm's block: same sub-modules as ldm's, sgm's call signature."""

    def __init__(self, ldm_block: torch.nn.Module) -> None:
        super().__init__()
        for name in ("attn1", "attn2"):
            ldm_attn = getattr(ldm_block, name)
            attn = CrossAttention.__new__(CrossAttention)
            attn.__dict__.update(ldm_attn.__dict__)  # same parameters, sgm's forward
            setattr(self, name, attn)
        self.ff, self.norm1, self.norm2, self.norm3 = ldm_block.ff, ldm_block.norm1, ldm_block.norm2, ldm_block.norm3
        self.disable_self_attn = getattr(ldm_block, "disable_self_attn", False)
        self.checkpoint = ldm_block.checkpoint

    def forward(self, x, context=None, additional_tokens=None, n_times_crossframe_attn_in_self=0):
        kwargs = {"x": x}
        if context is not None:
            kwargs["context"] = context
        if additional_tokens is not None:
            kwargs["additional_tokens"] = additional_tokens
        if n_times_crossframe_attn_in_self:
            kwargs["n_times_crossframe_attn_in_self"] = n_times_crossframe_attn_in_self
        return checkpoint(
            lambda *args: self._forward(**dict(zip(kwargs, args))), tuple(kwargs.values()), self.parameters(), self.checkpoint
        )

    def _forward(self, x, context=None, additional_tokens=None, n_times_crossframe_attn_in_self=0):
        x = (
            self.attn1(
                self.norm1(x),
                context=context if self.disable_self_attn else None,
                additional_tokens=additional_tokens,
                n_times_crossframe_attn_in_self=n_times_crossframe_attn_in_self if not self.disable_self_attn else 0,
            )
            + x
        )
        x = self.attn2(self.norm2(x), context=context, additional_tokens=additional_tokens) + x
        return self.ff(self.norm3(x)) + x


def build_sgm_sdxl_unet(seed: int = 0) -> torch.nn.Module:
    """A narrow SDXL-shaped UNet with sgm-style blocks."""
    torch.manual_seed(seed)
    unet = UNetModel(
        image_size=32,
        in_channels=4,
        out_channels=4,
        model_channels=32,
        attention_resolutions=[2, 4],
        num_res_blocks=1,
        channel_mult=[1, 2, 2],
        num_heads=2,
        use_spatial_transformer=True,
        transformer_depth=1,
        context_dim=32,
        use_checkpoint=True,
        legacy=False,
    )
    for module in list(unet.modules()):
        blocks = getattr(module, "transformer_blocks", None)
        if blocks is not None:
            for i, block in enumerate(blocks):
                blocks[i] = BasicTransformerBlock(block)
    return reinit_zeroed(unet, seed).eval()
