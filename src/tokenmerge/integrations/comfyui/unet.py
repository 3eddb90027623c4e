"""ComfyUI's UNets (SD 1.x, 2.x, XL) through ComfyUI's own attention patch points (no ComfyUI code is copied or patched).

:func:`patch_unet` clones the MODEL (a ``ModelPatcher``) and registers a :class:`ComfyTokenMerge` with
``set_model_attn1_patch`` / ``set_model_attn1_output_patch`` (and the attn2 pair for ``merge_crossattn``).
Unlike ComfyUI's built-in TomePatchModel, which merges only the queries of self-attention, the keys and
values are merged too (full ToMe, as tomesd does), which is where the speed-up comes from.

Differences from the diffusers/ldm hooks, forced by what the patch points see:

- the similarity is computed on ``norm1(x)`` (the tensor handed to the attn1 patch), not on the block input;
- a block's token grid is recovered from the UNet input's (H, W) (``original_shape``): the level ``d`` whose
  ``ceil(H/d) * ceil(W/d)`` equals the token count; blocks where none matches are left alone with a warning;
- ComfyUI has no patch point around the MLP, so ``merge_mlp`` is not offered.

``method="todo"``/``"auto"`` hand attention a downsampled copy of the tokens as keys and values through the
same attn1 patch point. What a block does is decided by :func:`tokenmerge.planning.decide`, as everywhere.
The state between a block's attn1 patch and its output patch is per thread.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from ...algorithms import TokenGrid, TokenSpan, downsample_tokens
from ...config import TokenMergeConfig
from ...families import ldm
from ...methods import IDLE, BlockFacts
from ...planning import block_key, decide
from ...steps import StepPosition
from .shared import SharedPatch, model_sampling_of

_LEVELS = (1, 2, 4, 8, 16, 32, 64)
_STAGES = {"input": 1, "middle": 2, "output": 3}


@functools.cache
def _comfy_block_key(stage: int, index: int, block_index: int) -> int:
    return block_key(stage, index, block_index)


def token_grid(original_shape: list[int] | tuple[int, ...], tokens: int) -> tuple[TokenGrid, int] | None:
    """The grid and level of a block whose input has ``tokens`` tokens, in a UNet whose input is ``original_shape``."""
    latent = TokenGrid((original_shape[-2], original_shape[-1]))
    for level in _LEVELS:
        grid = latent.scaled(level)
        if grid.numel == tokens:
            return grid, level
    return None


def top_attention_level(model_patcher: Any) -> int:
    """The highest-resolution level with spatial transformers in the patcher's UNet (1 on SD 1.x, 2 on SDXL)."""
    unet = model_patcher.model.diffusion_model
    layout = ldm.layout(unet)
    if layout is None:
        from ...families import comfy_models

        dits = ", ".join(model.title for _, model in comfy_models())
        raise TypeError(
            f"{type(unet).__name__} is neither a UNet with SpatialTransformer blocks nor a diffusion transformer tokenmerge "
            f"knows in ComfyUI; the node supports UNet models (SD 1.x, SD 2.x, SDXL) and {dits}"
        )
    return layout.top_level


class ComfyTokenMerge(SharedPatch):
    """The patch callables for one patched MODEL: decide in the attn1 patch, merge, unmerge after."""

    def __init__(self, config: TokenMergeConfig, top_level: int, model_sampling: Any = None) -> None:
        if config.merge_mlp:  # None (the default) means off on UNets
            raise ValueError("merge_mlp is not available in ComfyUI: it has no patch point around the MLP")
        if config.share_plan or config.reuse_steps != 1:
            raise ValueError("share_plan and reuse_steps are not available in ComfyUI's patch points; leave them at False and 1")
        super().__init__(config)
        self.top_level = top_level
        self.model_sampling = model_sampling
        if not config.is_identity and not config.merges_level(top_level, top_level):
            warnings.warn(
                f"tokenmerge: no transformer block is merged: max_downsample={config.max_downsample} but this "
                f"model's highest attention level is {top_level}; use auto or >= {top_level}",
                stacklevel=3,
            )

    @property
    def _state(self) -> Any:
        local = self._local
        if not hasattr(local, "action"):
            local.action, local.attn1, local.attn2, local.sigmas, local.noise, local.position = IDLE, None, None, None, None, None
        return local

    def _noise(self, extra_options: dict[str, Any]) -> tuple[float | None, StepPosition | None]:
        """This step's noise level where ``max_noise`` needs it and its position in the schedule where the few-step
        rule does, read once per step (ComfyUI hands every block of a step the same ``sigmas`` tensor)."""
        if self.config.noise_limit >= 1:
            return None, None
        state, sigmas = self._state, extra_options.get("sigmas")
        if sigmas is not state.sigmas:
            state.sigmas, state.noise = sigmas, self.step_noise(self.model_sampling, sigmas)
            state.position = self.step_position(self.model_sampling, extra_options, state.noise)
            self.notice_gate(state.noise, state.position)
        return state.noise, state.position

    def _grid(self, n: torch.Tensor, extra_options: dict[str, Any]) -> tuple[TokenGrid | None, int]:
        """The grid and level of this block's tokens."""
        if n.ndim != 3:
            return None, 0
        found = token_grid(extra_options["original_shape"], n.shape[1])
        if found is None:
            self.said.say(
                "grid",
                f"{n.shape[1]} tokens match no level of a {tuple(extra_options['original_shape'][-2:])} latent; such blocks are not merged",
            )
            return None, 0
        return found

    def attn1_patch(self, n: torch.Tensor, context: torch.Tensor, value: torch.Tensor, extra_options: dict[str, Any]):
        state = self._state
        state.action, state.attn1 = IDLE, None
        config = self.config
        if config.is_identity:
            return n, context, value
        grid, level = self._grid(n, extra_options)
        noise, position = self._noise(extra_options)
        stage, index = extra_options.get("block", ("input", 0))
        key = _comfy_block_key(_STAGES.get(stage, 0), index, extra_options.get("block_index", 0))
        facts = BlockFacts(
            level=level,
            top_level=self.top_level,
            grid=grid,
            noise=noise,
            position=position,
            tokens=lambda: n,
            key=key,
            timestep=extra_options.get("sigmas"),
            device=n.device,
        )
        action = decide(config, facts)
        state.action = action
        if action.kv_grid is not None:
            if context is not n:  # attn1 attends to a context already (disable_self_attn)
                return n, context, value
            kv = downsample_tokens(n, action.kv_grid, action.kv_factors, config.kv_interpolation)
            return n, kv, kv if value is n else value
        if action.plan is None or not config.merge_attn:
            return n, context, value
        merged = action.plan.gather(n)
        state.attn1 = action.plan
        # Self-attention: ComfyUI passes the same tensor as keys and values; merge them too.
        return merged, merged if context is n else context, merged if value is n else value

    def attn1_output_patch(self, n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        state = self._state
        plan, state.attn1 = state.attn1, None
        return n if plan is None else plan.scatter(n)

    def attn2_patch(self, n: torch.Tensor, context: torch.Tensor, value: torch.Tensor, extra_options: dict[str, Any]):
        state = self._state
        state.attn2 = None
        plan: TokenSpan | None = state.action.plan
        if plan is None or n.shape[1] != plan.num_tokens:
            return n, context, value
        state.attn2 = plan
        return plan.gather(n), context, value

    def attn2_output_patch(self, n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        state = self._state
        plan, state.attn2 = state.attn2, None
        return n if plan is None else plan.scatter(n)


def _drop_earlier_patches(model_patcher: Any) -> bool:
    """Take an earlier tokenmerge patch off a clone (the node applied twice in a chain): its merged tokens would be
    all that the second one sees. The clone's patch lists are its own (``clone()`` copies the model options)."""
    patches = model_patcher.model_options.get("transformer_options", {}).get("patches", {})
    found = False
    for name in ("attn1_patch", "attn1_output_patch", "attn2_patch", "attn2_output_patch"):
        if name in patches:
            kept = [p for p in patches[name] if not isinstance(getattr(p, "__self__", None), ComfyTokenMerge)]
            found = found or len(kept) != len(patches[name])
            patches[name] = kept
    return found


def patch_unet(model_patcher: Any, config: TokenMergeConfig) -> Any:
    """A clone of ``model_patcher`` with a :class:`ComfyTokenMerge` on its UNet's attention patch points."""
    patch = ComfyTokenMerge(config, top_attention_level(model_patcher), model_sampling_of(model_patcher))
    patched = model_patcher.clone()
    if _drop_earlier_patches(patched):
        warnings.warn("tokenmerge: this MODEL already carries a tokenmerge patch; it is replaced by this node's options", stacklevel=3)
    patched.set_model_attn1_patch(patch.attn1_patch)
    patched.set_model_attn1_output_patch(patch.attn1_output_patch)
    if config.merge_crossattn:
        patched.set_model_attn2_patch(patch.attn2_patch)
        patched.set_model_attn2_output_patch(patch.attn2_output_patch)
    return patched
