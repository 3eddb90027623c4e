"""Install and remove the hooks of one patch; warn where a patch would silently do little."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from .adapters import DenoiserLayout, compiled_parts, find_denoisers, patch_root
from .config import TokenMergeConfig, check_option_names
from .hooks import (
    STATE_ATTR,
    BlockState,
    BeginCall,
    CaptureGrid,
    DenoiserState,
    DownsampleKeysValues,
    GridState,
    MergeInput,
    PlanMerge,
    SubLayerState,
    UnmergeOutput,
)
from .matching import hash_ints

# Sub-layers wrapped per block, with the option that merges their tokens.
_SUBLAYERS = (("attn1", "merge_attn"), ("attn2", "merge_crossattn"), ("ff", "merge_mlp"))
_SELF_ATTN_MASK_KWARGS = ("attention_mask", "mask")  # a mask over the (query and key) tokens
_KV_KWARGS = ("encoder_hidden_states", "context")  # the input keys and values are computed from


def _install(layout: DenoiserLayout, config: TokenMergeConfig) -> DenoiserState:
    state = DenoiserState(config=config, top_level=layout.top_level, timestep_arg=layout.timestep_arg())
    handles = state.handles
    handles.append(layout.root.register_forward_pre_hook(BeginCall(state), with_kwargs=True))
    for container in layout.containers:
        grid = GridState()
        handles.append(container.module.register_forward_pre_hook(CaptureGrid(grid), with_kwargs=True))
        for block in container.blocks:
            index = len(state.blocks)
            block_state = BlockState(state, grid, container.level, hash_ints(0x70E, index), index)
            state.blocks.append(block_state)
            handles.append(block.register_forward_pre_hook(PlanMerge(block_state), with_kwargs=True))
            for name, option in _SUBLAYERS:
                sublayer = getattr(block, name, None)
                if sublayer is None:
                    continue
                shared = SubLayerState()
                mask_kwarg = _kwarg(sublayer, _SELF_ATTN_MASK_KWARGS) if name == "attn1" else None
                handles.append(
                    sublayer.register_forward_pre_hook(MergeInput(block_state, shared, option, mask_kwarg), with_kwargs=True)
                )
                handles.append(sublayer.register_forward_hook(UnmergeOutput(shared)))
                kv_kwarg = _kwarg(sublayer, _KV_KWARGS) if name == "attn1" else None
                if kv_kwarg is not None:
                    handles.append(sublayer.register_forward_pre_hook(DownsampleKeysValues(block_state, kv_kwarg), with_kwargs=True))
    setattr(layout.root, STATE_ATTR, state)
    return state


def _kwarg(attention: torch.nn.Module, candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` that this attention class's forward takes as a keyword."""
    params = inspect.signature(attention.forward).parameters
    return next((name for name in candidates if name in params), None)


def _states(model: Any) -> list[tuple[torch.nn.Module, DenoiserState]]:
    roots: list[torch.nn.Module] = []
    if hasattr(model, "components"):
        roots = [m for m in model.components.values() if isinstance(m, torch.nn.Module)]
    elif isinstance(model, torch.nn.Module):
        roots = [model]
    return [(m, s) for root in roots for m in root.modules() if isinstance(s := vars(m).get(STATE_ATTR), DenoiserState)]


def _warn_if_ineffective(states: list[DenoiserState], config: TokenMergeConfig) -> None:
    config.warn_if_capped(stacklevel=4)
    if not any(s.merged_blocks() for s in states):
        levels = sorted({b.level for s in states for b in s.blocks})
        warnings.warn(
            f"tokenmerge: no transformer block is merged: max_downsample={config.max_downsample} but this model's "
            f"attention blocks sit at downsampling factors {levels}; use max_downsample=None (auto) or >= {levels[0]}",
            stacklevel=3,
        )


def apply_patch(
    model: Any,
    ratio: float = 0.5,
    max_downsample: int | None = None,
    sx: int = 2,
    sy: int = 2,
    use_rand: bool = True,
    merge_attn: bool = True,
    merge_crossattn: bool = False,
    merge_mlp: bool = False,
    *,
    seed: int | None = None,
    method: str = "tome",
    kv_factor: int = 2,
    kv_interpolation: str = "nearest-exact",
    auto_max_keys: int = 512,
    auto_min_tokens: int = 1024,
    share_plan: bool = False,
    reuse_steps: int = 1,
    match_dtype: str | None = None,
    **unknown: Any,
) -> Any:
    """Patch ``model`` in place with Token Merging and return it (tomesd 0.1.3's signature and defaults,
    except ``max_downsample=None``: the highest-resolution level that has attention).

    ``model``: a diffusers pipeline (its UNet and every ControlNet are patched), a diffusers model with
    ``BasicTransformerBlock``s, the webui's latent-diffusion object or an ldm/sgm ``UNetModel``.
    ``method="todo"`` downsamples self-attention keys/values instead of merging tokens (``kv_factor``,
    ``kv_interpolation``); ``method="auto"`` picks the factor per block from its token count (never
    slower than vanilla). ``share_plan``, ``reuse_steps`` and ``match_dtype`` make ToMe's matching
    cheaper at some cost in fidelity. Patching again replaces the previous patch. See
    :class:`tokenmerge.TokenMergeConfig`.
    """
    check_option_names(unknown)
    config = TokenMergeConfig(
        ratio=ratio,
        max_downsample=max_downsample,
        sx=sx,
        sy=sy,
        use_rand=use_rand,
        merge_attn=merge_attn,
        merge_crossattn=merge_crossattn,
        merge_mlp=merge_mlp,
        seed=seed,
        method=method,
        kv_factor=kv_factor,
        kv_interpolation=kv_interpolation,
        auto_max_keys=auto_max_keys,
        auto_min_tokens=auto_min_tokens,
        share_plan=share_plan,
        reuse_steps=reuse_steps,
        match_dtype=match_dtype,
    )
    layouts = find_denoisers(model)
    remove_patch(model)
    states = [_install(layout, config) for layout in layouts]
    _warn_if_ineffective(states, config)
    _warn_if_compiled(model)
    return model


def _warn_if_compiled(model: Any) -> None:
    """torch.compile skips guards on module hooks by default: code compiled before the patch (for this
    module or any other of the same architecture) keeps running unpatched, silently."""
    compiled = compiled_parts(model)
    if compiled:
        warnings.warn(
            f"tokenmerge: {', '.join(compiled)} is already wrapped by torch.compile; graphs compiled before this patch "
            "ignore it (torch skips module-hook guards by default). Patch before compiling, or call "
            "torch._dynamo.reset() after patching, or set torch._dynamo.config.skip_nnmodule_hook_guards = False",
            stacklevel=3,
        )


def remove_patch(model: Any) -> Any:
    """Undo :func:`apply_patch`: every hook and attribute it added is removed. Returns what tomesd's
    ``remove_patch`` returns (a pipeline's ``unet``, else ``model``). A model without a patch is left as is."""
    for root, state in _states(model):
        for handle in state.handles:
            handle.remove()
        delattr(root, STATE_ATTR)
    return patch_root(model)


def update_options(model: Any, **changes: Any) -> TokenMergeConfig:
    """Change options of a patched model (ratio, seed, ...) without re-patching; returns the new config."""
    states = [s for _, s in _states(model)]
    if not states:
        raise ValueError(f"{type(model).__name__} is not patched by tokenmerge; call tokenmerge.apply_patch first")
    config = states[0].config.replace(**changes)
    for state in states:
        state.config = config
        state.reset()
    _warn_if_ineffective(states, config)
    return config


def get_config(model: Any) -> TokenMergeConfig | None:
    """The options a model is patched with, or ``None`` if it is not patched."""
    states = _states(model)
    return states[0][1].config if states else None
