"""ComfyUI integration through ComfyUI's own patch points (no ComfyUI code is copied or monkey-patched).

``TokenMergeNode`` clones the MODEL (a ``ModelPatcher``) and registers a :class:`ComfyTokenMerge` with
``set_model_attn1_patch`` / ``set_model_attn1_output_patch`` (and the attn2 pair for
``merge_crossattn``). Unlike ComfyUI's built-in TomePatchModel, which merges only the queries of
self-attention, the keys and values are merged too (full ToMe, as tomesd does), which is where the
speed-up comes from.

Differences from the diffusers/ldm hooks, forced by what the patch points see:

- the similarity is computed on ``norm1(x)`` (the tensor handed to the attn1 patch), not on the block
  input ``x``;
- a block's token grid is recovered from the UNet input's (H, W) (``original_shape``): the level ``d``
  whose ``ceil(H/d) * ceil(W/d)`` equals the token count; blocks where none matches are left unmerged
  with a warning;
- ComfyUI has no patch point around the MLP, so ``merge_mlp`` is not offered.

``method="todo"`` (token downsampling) hands attention a downsampled copy of the tokens as keys and
values through the same attn1 patch point; ``method="auto"`` picks its factor per block.

The module imports nothing from ComfyUI; ``comfyui_tokenmerge/`` in the repository is the custom-node
package that exposes :class:`TokenMergeNode` to ComfyUI.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import torch

from .adapters import ldm
from .config import TokenMergeConfig
from .matching import MergePlan, downsample_tokens, hash_ints
from .planning import kv_factor_for, plan_merge

_LEVELS = (1, 2, 4, 8, 16, 32, 64)
_STAGES = {"input": 1, "middle": 2, "output": 3}


@functools.lru_cache(maxsize=None)
def _block_key(stage: int, index: int, block_index: int) -> int:
    """The random-partition key of a block, computed once (the diffusers/ldm hooks do it at patch time)."""
    return hash_ints(0x70E, stage, index, block_index)


def token_grid(original_shape: list[int] | tuple[int, ...], tokens: int) -> tuple[int, int, int] | None:
    """(h, w, level) of a block whose input has ``tokens`` tokens, in a UNet whose input is ``original_shape``."""
    height, width = original_shape[-2], original_shape[-1]
    for level in _LEVELS:
        h, w = math.ceil(height / level), math.ceil(width / level)
        if h * w == tokens:
            return h, w, level
    return None


def top_attention_level(model_patcher: Any) -> int:
    """The highest-resolution level with spatial transformers in the patcher's UNet (1 on SD 1.x, 2 on SDXL)."""
    unet = model_patcher.model.diffusion_model
    levels = [c.level for c in ldm.containers(unet) if c.blocks] if ldm.is_denoiser(unet) else []
    if not levels:
        raise TypeError(
            f"{type(unet).__name__} has no SpatialTransformer blocks that tokenmerge can patch; "
            "the ComfyUI node supports UNet models (SD 1.x, SD 2.x, SDXL)"
        )
    return min(levels)


class ComfyTokenMerge:
    """The patch callables for one patched MODEL: compute a plan in the attn1 patch, merge, unmerge after."""

    def __init__(self, config: TokenMergeConfig, top_level: int) -> None:
        if config.merge_mlp:
            raise ValueError("merge_mlp is not available in ComfyUI: it has no patch point around the MLP")
        if config.share_plan or config.reuse_steps != 1:
            raise ValueError("share_plan and reuse_steps are not available in ComfyUI's patch points; leave them at False and 1")
        self.config = config
        self.merge_level = config.merge_level(top_level)
        if self.merge_level < top_level:
            warnings.warn(
                f"tokenmerge: no transformer block is merged: max_downsample={config.max_downsample} but this "
                f"model's highest attention level is {top_level}; use auto or >= {top_level}",
                stacklevel=3,
            )
        self.plan: MergePlan | None = None
        self.unmerge_attn1: MergePlan | None = None
        self.unmerge_attn2: MergePlan | None = None
        self._warned = False

    def _block_key(self, extra_options: dict[str, Any]) -> int:
        stage, index = extra_options.get("block", ("input", 0))
        return _block_key(_STAGES.get(stage, 0), index, extra_options.get("block_index", 0))

    def _active_grid(self, n: torch.Tensor, extra_options: dict[str, Any]) -> tuple[int, int] | None:
        """(h, w) of this block's tokens if the block is at a level that is merged, else None."""
        if n.ndim != 3:
            return None
        grid = token_grid(extra_options["original_shape"], n.shape[1])
        if grid is None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"tokenmerge: {n.shape[1]} tokens match no level of a {tuple(extra_options['original_shape'][-2:])} "
                    "latent; such blocks are not merged",
                    stacklevel=2,
                )
            return None
        h, w, level = grid
        return (h, w) if level <= self.merge_level else None

    def attn1_patch(self, n: torch.Tensor, context: torch.Tensor, value: torch.Tensor, extra_options: dict[str, Any]):
        self.plan = plan = None
        self.unmerge_attn1 = None
        config = self.config
        grid = None if config.is_identity else self._active_grid(n, extra_options)
        if grid is None:
            return n, context, value
        if config.method in ("todo", "auto"):
            factor = kv_factor_for(config, n.shape[1])
            if context is not n or factor == 1:  # attn1 attends to a context already (disable_self_attn)
                return n, context, value
            kv = downsample_tokens(n, grid[0], grid[1], factor, config.kv_interpolation)
            return n, kv, kv if value is n else value
        self.plan = plan = plan_merge(n, grid[0], grid[1], config, self._block_key(extra_options), extra_options.get("sigmas"))
        if plan is None or not config.merge_attn:
            return n, context, value
        merged = plan.merge(n)
        self.unmerge_attn1 = plan
        # Self-attention: ComfyUI passes the same tensor as keys and values; merge them too.
        return merged, merged if context is n else context, merged if value is n else value

    def attn1_output_patch(self, n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        plan, self.unmerge_attn1 = self.unmerge_attn1, None
        return n if plan is None else plan.unmerge(n)

    def attn2_patch(self, n: torch.Tensor, context: torch.Tensor, value: torch.Tensor, extra_options: dict[str, Any]):
        self.unmerge_attn2 = None
        if self.plan is None or n.shape[1] != self.plan.num_tokens:
            return n, context, value
        self.unmerge_attn2 = self.plan
        return self.plan.merge(n), context, value

    def attn2_output_patch(self, n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        plan, self.unmerge_attn2 = self.unmerge_attn2, None
        return n if plan is None else plan.unmerge(n)


def patch_model(model_patcher: Any, config: TokenMergeConfig) -> Any:
    """A clone of ``model_patcher`` with tokenmerge registered on ComfyUI's attention patch points."""
    patch = ComfyTokenMerge(config, top_attention_level(model_patcher))
    patched = model_patcher.clone()
    patched.set_model_attn1_patch(patch.attn1_patch)
    patched.set_model_attn1_output_patch(patch.attn1_output_patch)
    if config.merge_crossattn:
        patched.set_model_attn2_patch(patch.attn2_patch)
        patched.set_model_attn2_output_patch(patch.attn2_output_patch)
    return patched


class TokenMergeNode:
    """ComfyUI node "Token Merging (tokenmerge)": MODEL + options -> patched MODEL."""

    CATEGORY = "model_patches/unet"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = "Token Merging (ToMe for SD) with merged queries, keys and values; SDXL gets its level automatically."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {
            "required": {
                "model": ("MODEL",),
                "ratio": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 0.99, "step": 0.01}),
                "max_downsample": (["auto", "1", "2", "4", "8"], {"default": "auto"}),
                "sx": ("INT", {"default": 2, "min": 1, "max": 8}),
                "sy": ("INT", {"default": 2, "min": 1, "max": 8}),
                "use_rand": ("BOOLEAN", {"default": True}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
                "merge_crossattn": ("BOOLEAN", {"default": False}),
                "method": (["tome", "todo", "auto"], {"default": "tome"}),
                "kv_factor": ("INT", {"default": 2, "min": 1, "max": 8, "tooltip": "method todo: key/value downsampling factor"}),
            }
        }

    def patch(
        self,
        model: Any,
        ratio: float = 0.5,
        max_downsample: str = "auto",
        sx: int = 2,
        sy: int = 2,
        use_rand: bool = True,
        seed: int = 0,
        merge_crossattn: bool = False,
        method: str = "tome",
        kv_factor: int = 2,
    ) -> tuple[Any]:
        if max_downsample not in ("auto", "1", "2", "4", "8"):
            raise ValueError(f"max_downsample must be one of auto, 1, 2, 4, 8, got {max_downsample!r}")
        config = TokenMergeConfig(
            ratio=ratio,
            max_downsample=None if max_downsample == "auto" else int(max_downsample),
            sx=sx,
            sy=sy,
            use_rand=use_rand,
            merge_crossattn=merge_crossattn,
            seed=seed,
            method=method,
            kv_factor=kv_factor,
        )
        config.warn_if_capped()
        return (patch_model(model, config),)
