"""ComfyUI's diffusion transformers (Flux, Chroma, SD3, Qwen-Image, Wan, HunyuanVideo, HiDream, Lumina 2, LTXV):
key/value reduction through ComfyUI's own ``optimized_attention_override``.

ComfyUI (since about 0.3.60) hands every attention call of these models to
``transformer_options["optimized_attention_override"](func, q, k, v, heads, mask=..., skip_reshape=...)`` when it
is set, after the rotary embedding. Two pieces, both registered on a clone of the MODEL, none on ComfyUI's code:

- an ``APPLY_MODEL`` wrapper reads each call's latent shape and text length and keeps them for the calls that
  follow in this thread (the override itself sees only q, k, v);
- the override (:class:`DitKeyValues`) finds the image tokens of each self- or joint attention call from the
  family's ComfyUI data (:class:`tokenmerge.families.base.ComfyModel`: patch size, where the image sits), keeps
  the keys and values of a downsampled grid (``method="todo"`` / ``"auto"``, decided by
  :func:`tokenmerge.planning.decide` as everywhere) and calls the override that was set before it, if any, or the
  attention function: another node's override (SageAttention and the like) is chained, not replaced.

Queries are all kept (every token gets its output); text, reference and conditioning tokens are never reduced;
cross-attention (keys = text) is left alone. The methods whose spans run on gathered tokens run around whole blocks
instead (:mod:`.blocks`): the override sees one attention call, not the block around it, so gathered tokens could
not skip the MLP there (a span that fills keys uses an override too, :class:`AttentionOverride`, to give its
gathered queries every token's keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...algorithms import TokenGrid, reduce_keys_values
from ...config import TokenMergeConfig
from ...families import ComfyModel
from ...methods import BlockAction, BlockFacts, ThreadGenerations
from ...planning import decide
from ...steps import StepPosition
from .shared import SharedPatch, comfy_step

OVERRIDE = "optimized_attention_override"
WRAPPER_KEY = "tokenmerge"


@dataclass(frozen=True)
class DitCall:
    """What one call of the diffusion model gives its patches: the image grid, the text length, the noise level and
    timestep, and, for a key/value method, the block action decided once for the call (every attention call of it
    shares the grid; ToMe decides per block, on the block's tokens)."""

    grid: TokenGrid
    text: int
    action: BlockAction | None
    noise: float | None = None
    timestep: Any = None
    position: StepPosition | None = None
    generation: Any = None  # a per-generation method's state of this call (one of its generations' slots)


def _schedule_steps(options: Any) -> int | None:
    """The steps of the sampler's schedule: its ``sample_sigmas`` in the call's transformer options, one step between
    each two (their count, no host read); None where the sampler does not say."""
    sigmas = options.get("sample_sigmas") if isinstance(options, dict) else None
    return sigmas.numel() - 1 if isinstance(sigmas, torch.Tensor) and sigmas.ndim == 1 and sigmas.numel() > 1 else None


def latent_shape(x: torch.Tensor, kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The shape of the latent a call's grid comes from: ``x``'s, or, where the sampler packed several streams into one
    latent (LTX-2's video and audio, ``latent_shapes``), the first stream's: the video."""
    shapes = kwargs.get("latent_shapes")
    if isinstance(shapes, (list, tuple)) and len(shapes) > 1:
        return tuple(shapes[0])
    return tuple(x.shape)


def grid_of(latent_shape: tuple[int, ...], patch: tuple[int, ...]) -> TokenGrid:
    """The token grid of a latent (B, C, H, W) or (B, C, T, H, W): each side divided by the model's patch
    (:meth:`ComfyModel.patch_of`), rounded up (ComfyUI pads the latent to whole patches)."""
    sides = latent_shape[2:]
    return TokenGrid(tuple([-(-s // p) for s, p in zip(sides, patch[-len(sides) :])]))


class DitPatch(SharedPatch):
    """What the patches of one DiT MODEL share (its clones too): the options, the model's ComfyUI data, and the
    ``APPLY_MODEL`` wrapper that reads each call's grid and text length for the patches running inside it (per
    thread: the override and block patches see only their own arguments)."""

    def __init__(self, config: TokenMergeConfig, model: ComfyModel, patch: tuple[int, ...], pad: int = 1) -> None:
        super().__init__(config, f"{model.title}: ")
        self.model, self.patch = model, patch
        self.pad = pad  # ComfyModel.pad_of the instance (Z-Image: 32)
        self._generations = ThreadGenerations()

    def apply_model(self, executor: Any, x: torch.Tensor, t: Any, c_concat: Any = None, c_crossattn: Any = None, *args: Any, **kwargs: Any):
        text = c_crossattn.shape[1] if isinstance(c_crossattn, torch.Tensor) and c_crossattn.ndim == 3 else 0
        stack = self._local.__dict__.setdefault("calls", [])
        declined = self.declined(kwargs)
        if declined:
            self._warn("declined", declined)
        call = None
        if not declined:
            grid = grid_of(latent_shape(x, kwargs), self.patch)
            noise = position = generation = None
            # the model's sampling as this sampler runs it (a shift node's object patch applied)
            sampling = getattr(getattr(executor, "class_obj", None), "model_sampling", None)
            per_generation = self.config.method_of.per_generation and not self.config.is_identity
            # the call's one host read (a device sync on a GPU), where the gate or a generation needs it
            values, read = comfy_step(sampling, t) if self.config.noise_limit < 1 or per_generation else (None, None)
            options = args[1] if len(args) > 1 else kwargs.get("transformer_options")  # (control, transformer_options)
            if self.config.noise_limit < 1:
                noise = self.step_noise(sampling, t, read)
                position = self.step_position(sampling, options, noise)
                self.notice_gate(noise, position)
            if per_generation:
                generation = self._generation(x, values, read, _schedule_steps(options))
            facts = BlockFacts(level=1, top_level=1, grid=grid, noise=noise, position=position)
            action = decide(self.config, facts) if self.per_call else None
            call = DitCall(grid, text, action, noise, t if isinstance(t, torch.Tensor) else None, position, generation)
        stack.append(call)
        try:
            return executor(x, t, c_concat, c_crossattn, *args, **kwargs)
        finally:
            stack.pop()

    per_call = True  # one action per call (key/value methods); False: the patch decides per block

    def _generation(self, x: torch.Tensor, values: list[float] | None, noise: float | None, steps: int | None) -> Any:
        """The generation this call belongs to (this thread's, one per classifier-free guidance slot; a sampling run
        of the patched model starts afresh and ends it, :meth:`sampling`), its call begun; ``steps``: the sampler's."""
        return self.generations().begin_call(self.config, x, values, noise, steps=steps)

    def generations(self) -> Any:
        """This thread's generations of a per-generation method (the store its ``new_generations`` makes)."""
        return self._generations.of(self.config.method_of)

    def sampling(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        """The ``OUTER_SAMPLE`` wrapper of a per-generation method: one sampling run is one generation; what it cached
        is freed when it ends (and a run never starts from another's)."""
        self._generations.end()
        try:
            return executor(*args, **kwargs)
        finally:
            self._generations.end()

    def declined(self, kwargs: dict[str, Any]) -> str | None:
        """Why a call with these ``apply_model`` keywords runs unchanged (None: it does not)."""
        names = [name for name in self.model.declines if kwargs.get(name) is not None]
        return f"a call with {', '.join(names)} has more tokens than its latent's grid" if names else None

    def current(self) -> DitCall | None:
        """The innermost call of the model running in this thread, or None."""
        calls = getattr(self._local, "calls", None)
        return calls[-1] if calls else None

    def _warn(self, cause: str, message: str, outcome: str = "such calls run unchanged") -> None:
        self.said.say(cause, f"{message}; {outcome}")


class AttentionOverride(DitPatch):
    """A patch that is the MODEL's attention override too (``transformer_options["optimized_attention_override"]``):
    it chains the override set before it (``previous``) and, per call, one set after it."""

    previous: Any = None  # the override that stood there before (another node's), called after this one

    def apply_model(self, executor: Any, x: torch.Tensor, t: Any, c_concat: Any = None, c_crossattn: Any = None, *args: Any, **kwargs: Any):
        # args: (control, transformer_options), as ComfyUI's BaseModel.apply_model passes them
        options = args[1] if len(args) > 1 else kwargs.get("transformer_options")
        if isinstance(options, dict) and options.get(OVERRIDE) is not self:
            # a node after this one set its own override (core ModelAttentionBackend, SageAttention): the key is one
            # value, last writer wins; this call chains it instead of being dropped silently
            options = {**options, OVERRIDE: _Chained(self, options.get(OVERRIDE))}
            if len(args) > 1:
                args = (args[0], options, *args[2:])
            else:
                kwargs["transformer_options"] = options
        return super().apply_model(executor, x, t, c_concat, c_crossattn, *args, **kwargs)

    # --- the attention override ---

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        return self.attend(self.previous, func, *args, **kwargs)

    def attend(self, previous: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        """One attention call: its keys and values as this patch makes them where the call allows, then ``previous``
        (an override this one chains) or the attention function."""
        call = self.current()
        if call is not None and len(args) >= 3 and not self.config.is_identity:
            changed = self.keys_values(call, args, kwargs)
            if changed is not None:
                args, kwargs = changed
        if previous is not None:
            return previous(func, *args, **kwargs)
        return func(*args, **kwargs)

    def keys_values(self, call: DitCall, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        """The attention call's arguments with its keys and values changed (None: as they are)."""
        raise NotImplementedError


def with_mask(args: tuple, kwargs: dict[str, Any], mask: Any) -> tuple[tuple, dict[str, Any]]:
    """An attention call's arguments with its mask replaced: the fifth positional argument where the model passes it
    so (q, k, v, heads, mask: Qwen-Image, Lumina 2), else the ``mask`` keyword."""
    if len(args) > 4:
        return (*args[:4], mask, *args[5:]), kwargs
    return args, {**kwargs, "mask": mask}


def mask_of(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    mask = args[4] if len(args) > 4 else kwargs.get("mask")
    return mask if isinstance(mask, torch.Tensor) else None


class DitKeyValues(AttentionOverride):
    """The override and the wrapper of one patched DiT MODEL (shared by its clones; per-thread call state)."""

    def __init__(self, config: TokenMergeConfig, model: ComfyModel, patch: tuple[int, ...], previous: Any = None, pad: int = 1) -> None:
        if not config.method_of.reduces_keys or "comfyui-dit" not in config.method_of.routes:
            raise ValueError(f"DitKeyValues reduces keys and values (a key/value method), got method={config.method!r}")
        super().__init__(config, model, patch, pad)
        self.previous = previous

    def keys_values(self, call: DitCall, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        q, k, v = args[:3]
        heads_first = bool(kwargs.get("skip_reshape", False))  # (B, H, S, D); else (B, S, H * D)
        seq = -2 if heads_first else 1
        n, s_q, s_k = call.grid.numel, q.shape[seq], k.shape[seq]
        if s_k != s_q or s_k < n:  # cross-attention (keys = text or image-embedding tokens), or not this grid
            return None
        start = self.model.image_start(s_k, n, call.text, self.pad)
        if start is None:
            self._warn("layout", f"its attention has {s_k} tokens, where a {call.grid} grid and {call.text} text tokens do not fit")
            return None
        if call.action.kv_grid is None:
            return None
        mode = self.config.kv_interpolation
        mask = mask_of(args, kwargs)
        # q/k/v arrive as (B, H, S, D) (skip_reshape), (B, S, H*D) or, SD3's values, (B, S, H, D); keys and values may
        # have fewer heads than the queries (enable_gqa, passed on with every other keyword)
        found = reduce_keys_values(k, v, mask, start, call.grid, call.action.kv_factors, mode, dim=seq)
        if found is None:
            self._warn("mask", f"an attention mask is set and kv_interpolation={mode!r} is not nearest: keys kept whole")
            return None
        k, v, reduced_mask = found
        args = (q, k, v, *args[3:])
        return with_mask(args, kwargs, reduced_mask) if reduced_mask is not mask else (args, kwargs)


class _Chained:
    """The override of one call where another node set its override after tokenmerge's: tokenmerge's, chaining it."""

    def __init__(self, patch: AttentionOverride, later: Any) -> None:
        self.patch, self.later = patch, later

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        return self.patch.attend(self.later, func, *args, **kwargs)
