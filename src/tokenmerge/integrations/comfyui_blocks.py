"""``method="tome"`` on ComfyUI's diffusion transformers, through their block replace patches.

ComfyUI's DiTs call ``transformer_options["patches_replace"]["dit"][(kind, i)](args, {"original_block": f})`` in
place of their block ``i`` where one is set, with the block's inputs in ``args`` (``"img"``, ``"txt"``, ``"vec"``,
``"pe"``, ...). A :class:`BlockMerge` there merges the block's image tokens as ToMe does everywhere (the plan that
:func:`tokenmerge.planning.decide` makes on the block's own input, one matching per sample), gathers each sample's
rotary rows of the merged tokens (a merged token sits at its destination's position: the rotary is applied inside
the block, after this point, so it sees the merged sequence with the right positions), runs the block (or the block
patch that stood there before, which is chained) on the merged sequence, and adds the block's output residual back
to every token from its destination: attention and MLP both run on fewer tokens, as on the diffusers path (which
merges each of them between its residual additions). Text, reference and conditioning tokens are never merged.

The call's grid and text length come from the ``APPLY_MODEL`` wrapper the key/value route uses too
(:class:`tokenmerge.integrations.comfyui_dit.DitPatch`). A block whose arguments do not fit the grid (an attention
mask over the tokens, a per-token modulation, a rotary table of another length) runs whole, said once per cause.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import MergePlan
from ..config import TokenMergeConfig
from ..families import ComfyModel
from ..families.base import ComfyBlocks
from ..methods import BlockFacts
from ..planning import block_key, decide
from .comfyui_dit import DitCall, DitPatch

# Flux.2's and Qwen-Image edit's reference method that modulates the image and its references by token index (ranges
# a merge would shift)
TIMESTEP_ZERO = "index_timestep_zero"


class DitBlocks(DitPatch):
    """The block patches' shared part for one patched DiT MODEL: the options, the model's data, the call wrapper."""

    per_call = False  # ToMe decides per block, on the block's tokens

    def __init__(self, config: TokenMergeConfig, model: ComfyModel, patch: tuple[int, ...]) -> None:
        if not config.method_of.merges or model.route_for(config.method_of) != "comfyui-blocks":
            raise ValueError(f"DitBlocks merges around ComfyUI's blocks (method='tome' on {model.title}), got method={config.method!r}")
        super().__init__(config, model, patch)
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
        merged = None if call is None or self.config.is_identity else self._merge(kind, key, call, args)
        if merged is None:
            return run(args)
        plan, start, gathered, new = merged
        out = run(new)
        return {**out, "img": _restore(plan, start, args["img"], gathered, out["img"])}

    def _whole(self, cause: str, message: str) -> None:
        self._warn(cause, message, "such blocks run whole")

    def _merge(self, kind: str, key: int, call: DitCall, args: dict[str, Any]) -> tuple[MergePlan, int, torch.Tensor, dict] | None:
        x, n = args.get("img"), call.grid.numel
        if not isinstance(x, torch.Tensor) or x.ndim != 3:
            return None
        if kind in self.blocks.joint:
            start = self.model.image_start(x.shape[1], n, call.text)
        else:  # the image stream alone: [image; references], or [references; image] for an image placed last
            start = x.shape[1] - n if self.model.image == "last" else 0
        if start is None or start < 0 or start + n > x.shape[1]:
            self._whole("layout", f"a {kind} holds {x.shape[1]} tokens, where a {call.grid} grid and {call.text} text tokens do not fit")
            return None
        if any(_over_tokens(args.get(name), args.get("txt")) for name in ("attn_mask", "attention_mask", "self_attention_mask")):
            self._whole("mask", f"a {kind} has an attention mask over its tokens, which ToMe's merge does not follow")
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
        )
        plan = decide(self.config, facts).plan
        if plan is None:
            return None
        gathered = plan.gather(image)
        new = {**args, "img": torch.cat([x[:, :start], gathered, x[:, start + n :]], dim=1)}
        pe = args.get("pe")
        if self.blocks.pe_dims and pe is not None:
            # a table, or a tuple of tables and flags (LTX-Video: (cos, sin) in 0.3.64, (rotation, split) in 0.33)
            parts = list(pe) if isinstance(pe, (tuple, list)) else [pe]
            for i, part in enumerate(parts):
                if not isinstance(part, torch.Tensor):
                    continue
                dim = next((d for d in self.blocks.pe_dims if part.ndim > d and part.shape[d] >= x.shape[1]), self.blocks.pe_dims[0])
                parts[i] = _rotary_rows(part, dim, plan, start, x.shape[1], n)
                if parts[i] is None:
                    self._whole("rotary", f"a {kind}'s rotary table {tuple(part.shape)} does not follow its {x.shape[1]} tokens")
                    return None
            new["pe"] = type(pe)(parts) if isinstance(pe, (tuple, list)) else parts[0]
        return plan, start, gathered, new


def _over_tokens(mask: Any, text: Any) -> bool:
    """Whether an attention mask covers a block's tokens (ToMe's merge would have to follow it): any mask but one over
    the text keys alone (its last axis as long as the ``txt`` argument: LTX-Video's caption mask for its
    cross-attention)."""
    if not isinstance(mask, torch.Tensor):
        return False
    return not (isinstance(text, torch.Tensor) and text.ndim == 3 and mask.shape[-1] == text.shape[1])


def _rotary_rows(pe: torch.Tensor, dim: int, plan: MergePlan, start: int, length: int, n: int) -> torch.Tensor | None:
    """The rotary table of the merged sequence: ``pe``'s rows are [whatever precedes the stream; the stream of
    ``length`` tokens], the image's ``n`` rows from ``start`` in the stream; each sample's kept rows (its plan's
    ``keep_idx``) replace them. None where the table does not fit."""
    offset = pe.shape[dim] - length + start
    b = plan.batch_size
    if pe.ndim <= dim or offset < start or offset + n > pe.shape[dim] or pe.shape[0] not in (1, b):
        return None
    if pe.shape[0] != b:
        pe = pe.expand(b, *pe.shape[1:])
    image = pe.narrow(dim, offset, n)
    shape = [b] + [1] * (dim - 1) + [plan.num_kept] + [1] * (pe.ndim - dim - 1)
    index = plan.keep_idx.view(shape).expand(*image.shape[:dim], plan.num_kept, *image.shape[dim + 1 :])
    rest = pe.shape[dim] - offset - n
    return torch.cat([pe.narrow(dim, 0, offset), image.gather(dim, index), pe.narrow(dim, offset + n, rest)], dim=dim)


def _restore(plan: MergePlan, start: int, x: torch.Tensor, gathered: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every token's block output from the merged block's ``y``: each image token is its input plus the residual its
    destination's merged token got (``gathered``: the merged tokens as they went in); the rest of ``y`` in place."""
    n, k = plan.num_tokens, plan.num_kept
    image = x[:, start : start + n] + plan.scatter(y[:, start : start + k] - gathered)
    return torch.cat([y[:, :start], image, y[:, start + k :]], dim=1)


class BlockMerge:
    """The block replace patch of one block (``patches_replace["dit"][(kind, index)]``); ``previous``: the patch
    that stood there before (another node's), which it calls on the merged arguments. Shared by the MODEL's clones
    (``clone()`` deep-copies the options: this object is immutable)."""

    def __init__(self, patch: DitBlocks, kind: str, key: int, previous: Any = None) -> None:
        self.patch, self.kind, self.key, self.previous = patch, kind, key, previous

    def __call__(self, args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return self.patch.run(self.kind, self.key, args, extra, self.previous)

    def __deepcopy__(self, memo: dict) -> BlockMerge:
        return self


def add_block_patches(patched: Any, patch: DitBlocks, diffusion_model: Any) -> None:
    """Set a :class:`BlockMerge` on each block of ``diffusion_model`` in the clone ``patched``'s options, chaining the
    patch each replaces (:func:`drop_block_patches` has taken an earlier tokenmerge one off)."""
    options = patched.model_options.setdefault("transformer_options", {})
    replace = options.setdefault("patches_replace", {}).setdefault("dit", {})
    for number, (kind, attribute) in enumerate(patch.blocks.lists, 1):
        for index in range(len(getattr(diffusion_model, attribute, None) or ())):
            replace[(kind, index)] = BlockMerge(patch, kind, block_key(number, index), replace.get((kind, index)))


def drop_block_patches(patched: Any) -> bool:
    """Take tokenmerge's block patches off the clone ``patched`` (restoring what each replaced); whether any were."""
    replace = patched.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    found = False
    for key, value in list(replace.items()):
        if isinstance(value, BlockMerge):
            found = True
            if value.previous is None:
                del replace[key]
            else:
                replace[key] = value.previous
    return found
