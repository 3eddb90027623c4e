"""The methods whose spans run on gathered tokens (:attr:`tokenmerge.methods.Method.gathers`) on ComfyUI's diffusion
transformers, through their block replace patches.

ComfyUI's DiTs call ``transformer_options["patches_replace"]["dit"][(kind, i)](args, {"original_block": f})`` in
place of their block ``i`` where one is set, with the block's inputs in ``args`` (``"img"``, ``"txt"``, ``"vec"``,
``"pe"``, ...). A :class:`BlockPatch` there merges the block's image tokens as ToMe does everywhere (the plan that
:func:`tokenmerge.planning.decide` makes on the block's own input, one matching per sample), gathers each sample's
rotary rows of the merged tokens (a merged token sits at its destination's position: the rotary is applied inside
the block, after this point, so it sees the merged sequence with the right positions), runs the block (or the block
patch that stood there before, which is chained) on the merged sequence, and adds the block's output residual back
to every token from its destination: attention and MLP both run on fewer tokens, as on the diffusers path (which
merges each of them between its residual additions). Text, reference and conditioning tokens are never merged.
A plan that fills keys (a selection of the tokens to recompute, :class:`DitKeyFill`) runs the block on its tokens the
same way, gives the others the residual it keeps, and gives the block's attention every token's keys.

The call's grid and text length come from the ``APPLY_MODEL`` wrapper the key/value route uses too
(:class:`tokenmerge.integrations.comfyui.dit.DitPatch`). A block whose arguments do not fit the grid (an attention
mask over the tokens, a per-token modulation, a rotary table of another length) runs whole, said once per cause.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ...algorithms import TokenSpan, kept_positions, restore_residual, take_rows
from ...config import TokenMergeConfig
from ...families import ComfyModel
from ...families.base import ComfyBlocks
from ...methods import BlockFacts
from ...planning import block_key, decide
from .dit import WRAPPER_KEY, AttentionOverride, DitCall, DitPatch, mask_of, with_mask

# Flux.2's and Qwen-Image edit's reference method that modulates the image and its references by token index (ranges
# a merge would shift)
TIMESTEP_ZERO = "index_timestep_zero"


class DitBlocks(DitPatch):
    """The block patches' shared part for one patched DiT MODEL: the options, the model's data, the call wrapper."""

    per_call = False  # ToMe decides per block, on the block's tokens

    def __init__(self, config: TokenMergeConfig, model: ComfyModel, patch: tuple[int, ...], pad: int = 1) -> None:
        if not config.method_of.gathers or model.route_for(config.method_of) != "comfyui-blocks":
            raise ValueError(
                f"DitBlocks runs the methods whose spans run on gathered tokens around ComfyUI's blocks ({model.title}), got method={config.method!r}"
            )
        super().__init__(config, model, patch, pad)
        self.blocks: ComfyBlocks = model.blocks

    def declined(self, kwargs: dict[str, Any]) -> str | None:
        found = super().declined(kwargs)
        if found is None and kwargs.get("ref_latents_method") == TIMESTEP_ZERO:
            return f"a call with ref_latents_method={TIMESTEP_ZERO!r} modulates its image and references by token index, which a merge would shift"
        return found

    def run(self, kind: str, key: int, args: dict[str, Any], extra: dict[str, Any], previous: Any) -> dict[str, Any]:
        """One block (``key``: its random-partition key): merged where the call and its arguments allow, else as it
        would run unpatched."""
        run = extra["original_block"] if previous is None else (lambda a: previous(a, extra))
        call = self.current()
        merged = None if call is None or self.config.is_identity else self._gather(kind, key, call, args)
        if merged is None:
            return run(args)
        plan, start, gathered, new = merged
        out = self.run_span(plan, run, new)
        if plan.whole:  # a step that keeps every token: every token computed, its residual recorded
            n = plan.num_tokens
            plan.scatter(out["img"][:, start : start + n] - gathered)
            return out
        return {**out, "img": restore_residual(plan, start, args["img"], gathered, out["img"])}

    def run_span(self, plan: Any, run: Any, args: dict[str, Any]) -> dict[str, Any]:
        """The block run on the arguments its plan made (:class:`DitKeyFill`: with its attention's keys filled)."""
        return run(args)

    def _whole(self, cause: str, message: str) -> None:
        self._warn(cause, message, "such blocks run whole")

    def _gather(self, kind: str, key: int, call: DitCall, args: dict[str, Any]) -> tuple[TokenSpan, int, torch.Tensor, dict] | None:
        x, n = args.get("img"), call.grid.numel
        if not isinstance(x, torch.Tensor) or x.ndim != 3:
            return None
        if kind in self.blocks.joint:
            start = self.model.image_start(x.shape[1], n, call.text, self.pad)
        else:  # the image stream alone: [image; references], or [references; image] for an image placed last
            start = x.shape[1] - n if self.model.image == "last" else 0
        if start is None or start < 0 or start + n > x.shape[1]:
            self._whole("layout", f"a {kind} holds {x.shape[1]} tokens, where a {call.grid} grid and {call.text} text tokens do not fit")
            return None
        masks = [name for name in MASKS if _over_tokens(args.get(name), args.get("txt"))]
        if any(not _uniform_over_image(args[name], self._offset(args[name].shape[-1], x.shape[1], start), n) for name in masks):
            self._whole("mask", f"a {kind} has an attention mask that tells its image tokens apart, which ToMe's merge does not follow")
            return None
        if any(args.get(name) is not None for name in ("modulation_dims", "modulation_dims_img")):
            self._whole("ranges", f"a {kind} is modulated by token ranges (HunyuanVideo's token replace), which a merge would shift")
            return None
        vec = args.get("vec")
        if isinstance(vec, torch.Tensor) and vec.ndim >= 3 and vec.shape[1] == x.shape[1]:
            self._whole("per-token", f"a {kind} is modulated per token (a per-token timestep), which ToMe's merge does not follow")
            return None
        image = x[:, start : start + n]
        facts = BlockFacts(
            level=1,
            top_level=1,
            grid=call.grid,
            noise=call.noise,
            position=call.position,
            tokens=lambda: image,
            key=key,
            timestep=call.timestep,
            device=x.device,
            block=key,
            spans=1,  # the whole block, its residual per token
            cached_sites=(0,),  # its self- or joint attention (the first over its tokens)
            generation=call.generation,
        )
        plan = decide(self.config, facts).plan
        if plan is None:
            return None
        if plan.whole:  # the block runs on its own arguments, which it may add to in place (Flux)
            return plan, start, image.clone(), args
        gathered = plan.gather(image)
        new = {**args, "img": torch.cat([x[:, :start], gathered, x[:, start + n :]], dim=1)}
        for name in masks:  # the same for every image key: the merged tokens' columns are the first k of them
            mask = args[name]
            offset = self._offset(mask.shape[-1], x.shape[1], start)
            new[name] = torch.cat([mask[..., : offset + plan.num_kept], mask[..., offset + n :]], dim=-1)
        pe = args.get("pe")
        if self.blocks.pe_dims and pe is not None:
            # a table, or a tuple of tables and flags (LTX-Video: (cos, sin) in 0.3.64, (rotation, split) in 0.33)
            parts = list(pe) if isinstance(pe, (tuple, list)) else [pe]
            for i, part in enumerate(parts):
                if not isinstance(part, torch.Tensor):
                    continue
                dim = next((d for d in self.blocks.pe_dims if part.ndim > d and part.shape[d] >= x.shape[1]), self.blocks.pe_dims[0])
                fits = part.ndim > dim and part.shape[dim] >= x.shape[1]
                parts[i] = _rotary_rows(part, dim, plan, self._offset(part.shape[dim], x.shape[1], start), n) if fits else None
                if parts[i] is None:
                    self._whole("rotary", f"a {kind}'s rotary table {tuple(part.shape)} does not follow its {x.shape[1]} tokens")
                    return None
            new["pe"] = type(pe)(parts) if isinstance(pe, (tuple, list)) else parts[0]
        return plan, start, gathered, new

    def _offset(self, rows: int, length: int, start: int) -> int:
        """Where the image starts among the ``rows`` of a rotary table or the columns of a mask that cover a stream of
        ``length`` tokens whose image starts at ``start`` (:attr:`ComfyBlocks.stream_first`)."""
        return start if self.blocks.stream_first else rows - length + start


MASKS = ("attn_mask", "attention_mask", "self_attention_mask")  # the names block arguments give attention masks


def _uniform_over_image(mask: torch.Tensor, offset: int, n: int) -> bool:
    """Whether ``mask`` is a mask over the keys alone (no query axis) that is the same for every image key (its ``n``
    columns from ``offset``): the text-padding masks of HunyuanVideo and Lumina 2, whose image columns are all 0."""
    if (mask.ndim >= 3 and mask.shape[-2] > 1) or offset < 0 or offset + n > mask.shape[-1]:
        return False
    image = mask[..., offset : offset + n]
    return bool((image == image[..., :1]).all())


def _over_tokens(mask: Any, text: Any) -> bool:
    """Whether an attention mask covers a block's tokens (ToMe's merge would have to follow it): any mask but one over
    the text keys alone (its last axis as long as the ``txt`` argument: LTX-Video's caption mask for its
    cross-attention)."""
    if not isinstance(mask, torch.Tensor):
        return False
    return not (isinstance(text, torch.Tensor) and text.ndim == 3 and mask.shape[-1] == text.shape[1])


def _rotary_rows(pe: torch.Tensor, dim: int, plan: TokenSpan, offset: int, n: int) -> torch.Tensor | None:
    """The rotary table of the merged sequence: the image's ``n`` rows of ``pe`` from ``offset`` (along ``dim``)
    replaced by each sample's kept rows (its plan's ``keep_idx``). None where the table does not fit."""
    if pe.ndim <= dim or offset < 0 or offset + n > pe.shape[dim] or pe.shape[0] not in (1, plan.batch_size):
        return None
    return take_rows(pe, dim, kept_positions(plan.keep_idx.to(pe.device), offset, n, pe.shape[dim]))


COMPILE_KEY = "torch.compile"  # the wrapper key of ComfyUI's TorchCompileModel (comfy_api.torch_helpers)


class DitKeyFill(DitBlocks, AttentionOverride):
    """A per-generation method whose plans fill keys, around ComfyUI's blocks: a block's plan (a
    :class:`~tokenmerge.algorithms.TokenSpan`) runs it on the text and the tokens it gathers, the others taking their
    input plus their residual of the step that last computed them; as the MODEL's attention override too, it gives the block's self- or joint attention every
    image token's keys and values (the recomputed tokens' fresh, the others' from the last full step, after the
    rotary), so that the recomputed queries attend to every token. Its generations end with each sampling run
    (:meth:`sampling`)."""

    def __init__(self, config: TokenMergeConfig, model: ComfyModel, patch: tuple[int, ...], previous: Any = None, pad: int = 1) -> None:
        super().__init__(config, model, patch, pad)
        self.previous = previous

    # Under ComfyUI's TorchCompileModel, whose graphs keep no guards on transformer_options (where these patches
    # live), a traced block would keep the cache's state of the step it was traced at: each block runs outside the
    # compiled graph (UntracedBlockPatch; wrapped layers call this), said once, the model's layers around them compiled.
    run = torch.compiler.disable(DitBlocks.run)

    def apply_model(self, *args: Any, **kwargs: Any) -> Any:
        options = args[6] if len(args) > 6 else kwargs.get("transformer_options")  # (executor, x, t, concat, crossattn, control, it)
        wrappers = options.get("wrappers", {}).get("apply_model", {}) if isinstance(options, dict) else {}
        if COMPILE_KEY in wrappers and not self.config.is_identity:
            self._warn(
                "compiled",
                f"ComfyUI's TorchCompileModel compiles this model: method={self.config.method!r} reads and writes its state at every block, "
                "so the blocks run outside the compiled graph (eagerly, as without the compile node) and the layers around them compiled",
                "the cache acts as it does uncompiled",
            )
        return super().apply_model(*args, **kwargs)

    def run_span(self, plan: Any, run: Any, args: dict[str, Any]) -> dict[str, Any]:
        self._local.span = _Running(plan)
        try:
            out = run(args)
        finally:
            running, self._local.span = self._local.span, None
        if plan.whole and running.sites == 0:
            self._warn(
                "keys",
                "a block's attention over its tokens was not found (no self- or joint attention call of its length)",
                "such blocks are computed whole at every step",
            )
        return out

    def keys_values(self, call: DitCall, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        running: _Running | None = getattr(self._local, "span", None)
        if running is None:
            return None
        q, k, v = args[:3]
        heads_first = bool(kwargs.get("skip_reshape", False))  # (B, H, S, D); else (B, S, H * D), or SD3's (B, S, H, D)
        seq = -2 if heads_first else 1
        span, kept = running.span, running.span.num_kept
        if k.shape[seq] != q.shape[seq]:  # cross-attention (keys: text, CLIP image tokens)
            return None
        start = self.model.image_start(k.shape[seq] + span.num_tokens - kept, span.num_tokens, call.text, self.pad)
        if start is None or start + kept > k.shape[seq]:
            return None
        site, running.sites = running.sites, running.sites + 1
        if not span.whole and (span.block, site) not in span.generation.keys:  # not one the full step recorded
            return None
        d = None if heads_first else q.shape[-1] // int(args[3] if len(args) > 3 else kwargs["heads"])

        def to(t: torch.Tensor) -> torch.Tensor:  # (B, H, S, D)
            return t if heads_first else t.transpose(1, 2) if t.ndim == 4 else t.unflatten(-1, (-1, d)).transpose(1, 2)

        def back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return t if heads_first else t.transpose(1, 2) if like.ndim == 4 else t.transpose(1, 2).flatten(2)

        mask = mask_of(args, kwargs)
        keys, values, filled = span.fill_keys(site, to(k), to(v), mask, start)
        args = (q, back(keys, k), back(values, v), *args[3:])
        return with_mask(args, kwargs, filled) if filled is not mask else (args, kwargs)


class _Running:
    """The span of the block running in this thread, and the attention calls over its tokens so far."""

    def __init__(self, span: Any) -> None:
        self.span, self.sites = span, 0


class BlockPatch:
    """The block replace patch of one block (``patches_replace["dit"][(kind, index)]``); ``previous``: the patch
    that stood there before (another node's), which it calls on the merged arguments. Shared by the MODEL's clones
    (``clone()`` deep-copies the options: this object is immutable)."""

    def __init__(self, patch: DitBlocks, kind: str, key: int, previous: Any = None) -> None:
        self.patch, self.kind, self.key, self.previous = patch, kind, key, previous

    def __call__(self, args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return self.patch.run(self.kind, self.key, args, extra, self.previous)

    def __deepcopy__(self, memo: dict) -> BlockPatch:
        return self


class UntracedBlockPatch(BlockPatch):
    """A :class:`BlockPatch` of a method that keeps state across a generation's calls: never traced
    into a compiled graph (one object per block, which a graph guards on where ComfyUI keeps its guards)."""

    __call__ = torch.compiler.disable(BlockPatch.__call__)


class LayerPatch:
    """The forward of one layer of a model whose blocks offer no replace patch (NextDiT), set on the layer while a call
    of the patched model runs (:class:`WrappedLayers`): the layer run as a :class:`BlockPatch` runs its block, its
    arguments ``(x, mask, rotary, modulation, ...)`` read as a block patch's ``img``, ``attn_mask``, ``pe``, ``vec``."""

    def __init__(self, patch: DitBlocks, kind: str, key: int, layer: torch.nn.Module) -> None:
        self.patch, self.kind, self.key, self.layer = patch, kind, key, layer

    def __call__(self, x: torch.Tensor, mask: Any, rotary: Any, modulation: Any = None, *rest: Any, **kwargs: Any) -> Any:
        forward = type(self.layer).forward
        if kwargs.get("timestep_zero_index") is not None:
            self.patch._whole("ranges", f"a {self.kind} is modulated by token ranges (timestep_zero_index), which a merge would shift")
            return forward(self.layer, x, mask, rotary, modulation, *rest, **kwargs)

        def original(a: dict[str, Any]) -> dict[str, Any]:
            return {"img": forward(self.layer, a["img"], a["attn_mask"], a["pe"], a["vec"], *rest, **kwargs)}

        args = {"img": x, "attn_mask": mask, "pe": rotary, "vec": modulation}
        return self.patch.run(self.kind, self.key, args, {"original_block": original}, None)["img"]


class WrappedLayers:
    """The ``DIFFUSION_MODEL`` wrapper of one patched model without block patches: while any call of it runs, each of
    its layers' ``forward`` is a :class:`LayerPatch` (an instance attribute, taken off when the last concurrent call
    ends; the module tree, its weights and their names stay as they are). A call of another MODEL on the same weights
    meanwhile runs its layers whole (no tokenmerge call in that thread)."""

    def __init__(self, patch: DitBlocks) -> None:
        self.patch = patch
        self._lock = threading.Lock()
        self._running = 0

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        model = executor.class_obj
        with self._lock:
            if self._running == 0:
                for number, (kind, attribute) in enumerate(self.patch.blocks.lists, 1):
                    for index, layer in enumerate(getattr(model, attribute, None) or ()):
                        layer.forward = LayerPatch(self.patch, kind, block_key(number, index), layer)
            self._running += 1
        try:
            return executor(*args, **kwargs)
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    for _, attribute in self.patch.blocks.lists:
                        for layer in getattr(model, attribute, None) or ():
                            layer.__dict__.pop("forward", None)

    def __deepcopy__(self, memo: dict) -> WrappedLayers:
        return self


def add_block_patches(patched: Any, patch: DitBlocks, diffusion_model: Any) -> None:
    """Set a :class:`BlockPatch` on each block of ``diffusion_model`` in the clone ``patched``'s options, chaining the
    patch each replaces (:func:`drop_block_patches` has taken an earlier tokenmerge one off); a model without block
    patches gets its :class:`WrappedLayers` instead."""
    if patch.blocks.wrapped:
        import comfy.patcher_extension

        patched.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, WrappedLayers(patch))
        return
    options = patched.model_options.setdefault("transformer_options", {})
    replace = options.setdefault("patches_replace", {}).setdefault("dit", {})
    merge = UntracedBlockPatch if patch.config.method_of.per_generation else BlockPatch
    for number, (kind, attribute) in enumerate(patch.blocks.lists, 1):
        for index in range(len(getattr(diffusion_model, attribute, None) or ())):
            replace[(kind, index)] = merge(patch, kind, block_key(number, index), replace.get((kind, index)))


def drop_block_patches(patched: Any) -> bool:
    """Take tokenmerge's block patches (and layer wrapper) off the clone ``patched`` (restoring what each replaced);
    whether any were."""
    import comfy.patcher_extension

    replace = patched.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    found = bool(getattr(patched, "wrappers", {}).get(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, {}).get(WRAPPER_KEY))
    if found:
        patched.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY)
    for key, value in list(replace.items()):
        if isinstance(value, BlockPatch):
            found = True
            if value.previous is None:
                del replace[key]
            else:
                replace[key] = value.previous
    return found
