"""ComfyUI integration through ComfyUI's own attention patch points (no ComfyUI code is copied or patched).

:func:`patch_model` clones the MODEL (a ``ModelPatcher``) and registers a :class:`ComfyTokenMerge` with
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

This module serves ComfyUI's UNets (SD 1.x, 2.x, XL) and holds the node; ComfyUI's diffusion transformers (Flux,
Flux.2, SD3, Qwen-Image, Wan, ...) are patched through its attention override (:mod:`.comfyui_dit`).

This module imports nothing from ComfyUI; the repository's root ``__init__.py`` exposes :class:`TokenMergeNode`.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import torch

from ..algorithms import MergePlan, TokenGrid, downsample_tokens
from ..config import OPTION_NAMES, TokenMergeConfig
from ..families import ldm
from ..methods import IDLE, OPTIONS, OWNERS, BlockFacts, methods_on
from ..notices import warn_at_caller
from ..planning import block_key, decide, gated
from ..steps import StepPosition, StepTrack, counts_steps, few_step_clause, few_step_notice, locate

_LEVELS = (1, 2, 4, 8, 16, 32, 64)
_STAGES = {"input": 1, "middle": 2, "output": 3}
COMFY_METHODS = methods_on("comfyui-unet", "comfyui-dit", "comfyui-blocks")  # what the node offers
# The node's inputs in the order saved workflows hold their widgets' values (positionally): the first node's
# required inputs, then the optional ones as they were added; every other option follows, optional (advanced).
REQUIRED = (
    "ratio",
    "max_downsample",
    "sx",
    "sy",
    "use_rand",
    "seed",
    "merge_crossattn",
    "method",
    "kv_factor",
    "kv_interpolation",
    "max_noise",
)
OPTIONAL = (
    "recompute",
    "refresh_every",
    "full_steps",
    "cache_dtype",
    "memory",
    *(
        name
        for name in OPTION_NAMES
        if name not in REQUIRED and name not in ("recompute", "refresh_every", "full_steps", "cache_dtype", "memory")
    ),
)


def node_input(name: str) -> tuple[Any, dict[str, Any]]:
    """The node's input for option ``name``, made from its declaration (:mod:`tokenmerge.options`)."""
    option = OPTIONS[name]
    owner = OWNERS[name]
    tooltip = f"method {owner}: {option.help}" if owner else option.help
    if option.none is not None and option.kind != "seed":  # (a seed's None is 0)
        tooltip += f" ({option.words[0] if option.words else 0}: {option.none})"
    info: dict[str, Any] = {"default": option.widget_default, "tooltip": tooltip}
    if name == "method":
        return list(COMFY_METHODS), info
    if option.words is not None:
        return list(option.words), info
    if option.kind == "bool":
        return "BOOLEAN", info
    low, high = option.widget_range
    if option.kind == "real":
        return "FLOAT", {**info, "min": low, "max": high, "step": option.step or 0.01}
    return "INT", {**info, "min": low, "max": high}


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
        from ..families import comfy_models

        dits = ", ".join(model.title for _, model in comfy_models())
        raise TypeError(
            f"{type(unet).__name__} is neither a UNet with SpatialTransformer blocks nor a diffusion transformer tokenmerge "
            f"knows in ComfyUI; the node supports UNet models (SD 1.x, SD 2.x, SDXL) and {dits}"
        )
    return layout.top_level


def model_sampling_of(model_patcher: Any) -> Any:
    """The MODEL's ``model_sampling`` (a sampling node's object patch included), or None."""
    get = getattr(model_patcher, "get_model_object", None)
    try:
        return get("model_sampling") if get is not None else model_patcher.model.model_sampling
    except AttributeError:
        return None


def comfy_noise(model_sampling: Any, sigma: Any) -> float | None:
    """The noise level of a ComfyUI step (1 = pure noise, 0 = clean): the timestep ``model_sampling`` gives its
    ``sigma`` (0..999 on SD models, sigma itself on flow models) as a fraction of the noisiest one. None where
    either is missing. One host read."""
    return comfy_step(model_sampling, sigma)[1]


def comfy_step(model_sampling: Any, sigma: Any) -> tuple[list[float] | None, float | None]:
    """A ComfyUI step's ``sigma`` values and noise level (:func:`comfy_noise`), read together: one host read (a
    device sync on a GPU). (None, None) where ``sigma`` is not a tensor; a noise level of None without
    ``model_sampling``."""
    if not isinstance(sigma, torch.Tensor):
        return None, None
    sigma = sigma.detach().float()
    if model_sampling is None:
        return sigma.flatten().tolist(), None
    level = model_sampling.timestep(sigma).max().double() / torch.as_tensor(model_sampling.timestep(model_sampling.sigma_max)).double()
    *values, noise = torch.cat([sigma.flatten().double(), level.reshape(1).to(sigma.device)]).tolist()
    return values, noise


def comfy_levels(model_sampling: Any, sample_sigmas: Any) -> list[float] | None:
    """The noise levels (as :func:`comfy_noise`) of the steps of a sampler's ``sample_sigmas`` (ComfyUI's
    ``transformer_options``; the final 0 is where the last step ends, not a step)."""
    if model_sampling is None or not isinstance(sample_sigmas, torch.Tensor) or sample_sigmas.numel() < 2:
        return None
    sigmas = sample_sigmas.detach().float().cpu()
    sigmas = sigmas[:-1] if float(sigmas[-1]) == 0 else sigmas
    top = float(model_sampling.timestep(model_sampling.sigma_max))
    return [float(model_sampling.timestep(s)) / top for s in sigmas]


class SharedPatch:
    """A patch object one patched MODEL and all its clones share: ``ModelPatcher.clone()`` deep-copies the model
    options, and a deep copy is the object itself (immutable apart from per-thread call state in ``_local``),
    which pickling leaves out."""

    _local: threading.local
    _noise_warned = False
    _gate_noticed = False
    _few_noticed = False
    config: TokenMergeConfig

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __deepcopy__(self, memo: dict) -> SharedPatch:
        return self

    def step_position(self, model_sampling: Any, options: Any, noise: float | None) -> StepPosition | None:
        """This step's position in its schedule where the default gate's few-step rule needs it: read from the
        sampler's ``sample_sigmas`` in the call's transformer ``options``, else estimated from this thread's steps
        (:mod:`tokenmerge.steps`). A few-step schedule is said once per patch."""
        if noise is None or self.config.few_step_share is None:
            return None
        levels = comfy_levels(model_sampling, options.get("sample_sigmas") if isinstance(options, dict) else None)
        position = locate(self._local.__dict__.setdefault("steps", StepTrack()), levels, noise)
        if position is not None and position.few and not self._few_noticed:
            self._few_noticed = True
            source = "the sampler's sigmas" if position.known else "its steps"
            warn_at_caller(f"tokenmerge: {few_step_notice(self.config, position, source)}")
        return position

    def notice_gate(self, noise: float | None, position: StepPosition | None) -> None:
        """A step the noise gate leaves whole is said once per patch (a few-step schedule is said apart)."""
        if self._gate_noticed or counts_steps(self.config, position):
            return
        if gated(self.config, noise, position):
            self._gate_noticed = True
            default = few_step_clause(self.config) if self.config.max_noise is None else ""
            warn_at_caller(
                f"tokenmerge: method={self.config.method!r} leaves this step whole: its noise level {noise:.3f} (1 = pure noise) "
                f"is above max_noise={self.config.noise_limit:g}{default}, so only the later, less noisy steps are reduced (flow "
                "models' shifted schedules may have none at large sizes or few steps); set max_noise=1 on the node to reduce "
                "every step (faster, less faithful)"
            )

    def step_noise(self, model_sampling: Any, sigma: Any, noise: float | None = None) -> float | None:
        """:func:`comfy_noise` of a step (``noise``: read already); where it cannot be read, one warning per patch
        that ``max_noise`` cannot act (its own flag: a warning about something else must not hide it)."""
        noise = comfy_noise(model_sampling, sigma) if noise is None else noise
        if noise is None and not self._noise_warned:
            self._noise_warned = True
            warn_at_caller(
                f"tokenmerge: this step's noise level cannot be read, so max_noise={self.config.noise_limit:g} cannot act: every step is reduced",
            )
        return noise


class ComfyTokenMerge(SharedPatch):
    """The patch callables for one patched MODEL: decide in the attn1 patch, merge, unmerge after."""

    def __init__(self, config: TokenMergeConfig, top_level: int, model_sampling: Any = None) -> None:
        if config.merge_mlp:  # None (the default) means off on UNets
            raise ValueError("merge_mlp is not available in ComfyUI: it has no patch point around the MLP")
        if config.share_plan or config.reuse_steps != 1:
            raise ValueError("share_plan and reuse_steps are not available in ComfyUI's patch points; leave them at False and 1")
        self.config = config
        self.top_level = top_level
        self.model_sampling = model_sampling
        if not config.is_identity and not config.merges_level(top_level, top_level):
            warnings.warn(
                f"tokenmerge: no transformer block is merged: max_downsample={config.max_downsample} but this "
                f"model's highest attention level is {top_level}; use auto or >= {top_level}",
                stacklevel=3,
            )
        self._local = threading.local()
        self._warned = False

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
            if not self._warned:
                self._warned = True
                warn_at_caller(
                    f"tokenmerge: {n.shape[1]} tokens match no level of a {tuple(extra_options['original_shape'][-2:])} "
                    "latent; such blocks are not merged",
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
        plan: MergePlan | None = state.action.plan
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


def patch_model(model_patcher: Any, config: TokenMergeConfig) -> Any:
    """A clone of ``model_patcher`` with tokenmerge registered on ComfyUI's attention patch points (UNets) or its
    attention override (diffusion transformers, :mod:`.comfyui_dit`)."""
    from .comfyui_dit import patch_dit

    if config.method not in COMFY_METHODS:
        raise ValueError(
            f"method={config.method!r} does not run through ComfyUI's model patcher yet (it runs in diffusers and the "
            f"webui); method must be one of {', '.join(COMFY_METHODS)} here"
        )
    dit = patch_dit(model_patcher, config)
    if dit is not None:
        return dit
    if "comfyui-unet" not in config.method_of.routes:
        raise ValueError(
            f"method={config.method!r} runs on ComfyUI's diffusion transformers, around their blocks; ComfyUI's UNets offer "
            "patch points around attention only; method must be one of "
            f"{', '.join(methods_on('comfyui-unet'))} on a UNet"
        )
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


class TokenMergeNode:
    """ComfyUI node "Token Merging (tokenmerge)": MODEL + options -> patched MODEL. Defaults come from
    :class:`tokenmerge.TokenMergeConfig`; enumerated options are choices, never free text."""

    CATEGORY = "model_patches/unet"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = (
        "Token merging (ToMe for SD) with merged queries, keys and values, key/value downsampling (todo/auto), or token-wise "
        "caching across steps (tokencache, diffusion transformers); SDXL gets its level automatically."
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        required = {"model": ("MODEL",)} | {name: node_input(name) for name in REQUIRED}
        return {"required": required, "optional": {name: node_input(name) for name in OPTIONAL}}

    def patch(self, model: Any, **values: Any) -> tuple[Any]:
        config = TokenMergeConfig(**{name: OPTIONS[name].from_widget(value) for name, value in values.items()})
        config.warn_if_capped()
        return (patch_model(model, config),)
