"""What an adapter tells the patcher about one denoiser: its token grids, blocks and where tokens flow.

An adapter (one per model family) finds the blocks and describes them with the types below; the patcher
attaches the same generic hooks to every family. Nothing here imports a model library: classes are
recognised by name along the MRO.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

GridReader = Callable[[tuple, dict], "tuple[int, int] | None"]  # ImageGrid, FluxGrid: picklable classes


def has_class_named(obj: object, *names: str) -> bool:
    """True if any class in ``obj``'s MRO has one of ``names``: no import of the model library needed."""
    return any(cls.__name__ in names for cls in type(obj).__mro__)


class Argument:
    """Reads argument ``name`` of ``module.forward`` from a hook's (args, kwargs), by keyword or by position
    (its position in the class's ``forward`` signature: gradient checkpointing calls blocks positionally)."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        params = [p for p in inspect.signature(type(module).forward).parameters.values() if p.name != "self"]
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.name = name
        self.position = names.index(name) if name in names else None

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.name in kwargs:
            return kwargs[self.name]
        return args[self.position] if self.position is not None and len(args) > self.position else None


@dataclass
class Span:
    """Where one merged stretch of a block begins and ends: tokens are merged on entering ``enter`` (its
    input, or element ``enter_index`` of its output) and unmerged on leaving ``leave`` (its output, or
    element ``leave_index`` of it). ``option`` (merge_attn / merge_crossattn / merge_mlp) switches it.

    ``text_first``: the merged tensor is [text; image] (Flux's single-stream blocks); only the image part is
    merged, the text length is read from the block call. ``rotary``: attention modules whose
    ``image_rotary_emb`` table (text rows first) must follow the merge.
    """

    option: str
    enter: torch.nn.Module
    leave: torch.nn.Module
    enter_on_output: bool = False
    enter_index: int | None = None
    leave_index: int | None = None
    text_first: bool = False
    rotary: tuple[torch.nn.Module, ...] = ()
    name: str = ""


@dataclass
class KeyValueSite:
    """A self-attention (or joint attention) whose image keys and values ``method="todo"/"auto"`` downsample.

    ``image_first``: position of the image tokens in its key sequence ([image; text] as SD3, or
    [text; image] as Flux). ``context_kwarg``: for plain self-attention, the keyword through which a
    downsampled copy of the tokens can be handed to the unchanged attention as its key/value source
    (cheapest: the key and value projections then run on fewer tokens); ``projections`` does the same
    for a joint attention whose image keys and values have projections of their own; without either, or
    when the projections are fused, keys and values are downsampled at the attention call itself.
    """

    module: torch.nn.Module
    image_first: bool = True
    context_kwarg: str | None = None
    mask_kwarg: str | None = None
    # Key and value projections that see exactly the image tokens, with nothing position-dependent after them
    # (SD3's to_k / to_v): their inputs can be downsampled, so that they run on fewer tokens.
    projections: tuple[torch.nn.Module, ...] = ()


@dataclass
class BlockLayout:
    """One transformer block: its spans and key/value sites, and how to read its inputs."""

    module: torch.nn.Module
    spans: list[Span] = field(default_factory=list)
    kv_sites: list[KeyValueSite] = field(default_factory=list)
    input_name: str = "hidden_states"  # the image tokens (B, N, C): the matching is computed on them
    text_name: str | None = None  # Flux single-stream blocks: the text tokens, whose length the spans need
    plan_shared_by_batch: bool = False  # a position table shared by the batch follows the merge (Flux)
    recompute_method: str | None = None  # ldm/sgm: the method their own checkpoint re-runs in backward
    kind: str = ""  # for describe(): "BasicTransformerBlock", "JointTransformerBlock", ...


@dataclass
class Container:
    """A module whose blocks all see one token grid, read from its input by ``grid``; ``level`` is that grid's
    downsampling factor relative to the denoiser's input (1 at a UNet's top level and in a transformer)."""

    module: torch.nn.Module
    blocks: list[BlockLayout]
    level: int
    grid: GridReader


@dataclass
class DenoiserLayout:
    """A denoiser (UNet, transformer, ControlNet, ...) and its containers, in execution order."""

    root: torch.nn.Module
    containers: list[Container]
    family: str
    single_level: bool = False  # a transformer: one token grid, so max_downsample has no meaning there
    timestep_names: tuple[str, ...] = ("timestep", "timesteps", "t")

    @property
    def top_level(self) -> int:
        return min(c.level for c in self.containers)

    @property
    def blocks(self) -> list[BlockLayout]:
        return [b for c in self.containers for b in c.blocks]

    def timestep_reader(self) -> Argument | None:
        """A reader of the timestep argument of the root's class ``forward`` (the class's, not the instance's:
        a wrapper that replaced ``forward`` with ``*args, **kwargs`` must not hide it)."""
        params = inspect.signature(type(self.root).forward).parameters
        name = next((n for n in self.timestep_names if n in params), None)
        return None if name is None else Argument(self.root, name)


class ImageGrid:
    """(H // p, W // p) of a (B, C, H, W) first input (``hidden_states`` / ``x`` / ``sample``)."""

    def __init__(self, patch_size: int = 1) -> None:
        self.patch_size = patch_size

    def __call__(self, args: tuple, kwargs: dict) -> tuple[int, int] | None:
        x = args[0] if args else next((kwargs[k] for k in ("hidden_states", "x", "sample") if k in kwargs), None)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            return None
        return x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size


def attention_self_kwargs(attention: torch.nn.Module) -> tuple[str | None, str | None]:
    """(context keyword, mask keyword) that this attention class's forward takes, if any."""
    params = inspect.signature(type(attention).forward).parameters
    context = next((n for n in ("encoder_hidden_states", "context") if n in params), None)
    mask = next((n for n in ("attention_mask", "mask") if n in params), None)
    return context, mask


def basic_block(module: torch.nn.Module, recompute_method: str | None = None) -> BlockLayout:
    """A ``BasicTransformerBlock`` (diffusers, ldm, sgm): attn1 / attn2 / ff, each a merged span of its own."""
    spans: list[Span] = []
    for name, option in (("attn1", "merge_attn"), ("attn2", "merge_crossattn"), ("ff", "merge_mlp")):
        sub = getattr(module, name, None)
        if isinstance(sub, torch.nn.Module):
            spans.append(Span(option, sub, sub, name=name))
    kv_sites = []
    attn1 = getattr(module, "attn1", None)
    if isinstance(attn1, torch.nn.Module):
        context, mask = attention_self_kwargs(attn1)
        kv_sites.append(KeyValueSite(attn1, context_kwarg=context, mask_kwarg=mask))
    input_name = "hidden_states" if "hidden_states" in inspect.signature(type(module).forward).parameters else "x"
    return BlockLayout(module, spans, kv_sites, input_name=input_name, recompute_method=recompute_method, kind=type(module).__name__)


def containers_in(
    block: torch.nn.Module | None,
    level: int,
    is_container: Callable[[torch.nn.Module], bool],
    make_block: Callable[[torch.nn.Module], BlockLayout],
) -> list[Container]:
    """The spatial transformers inside one UNet block, all at that block's resolution ``level``."""
    if block is None:
        return []
    found = []
    for m in block.modules():
        if is_container(m):
            blocks = [make_block(b) for b in spatial_blocks(m)]
            if blocks:
                found.append(Container(m, blocks, level, ImageGrid()))
    return found


def spatial_blocks(container: torch.nn.Module) -> list[torch.nn.Module]:
    """The spatial ``BasicTransformerBlock``s of a container (temporal blocks have other classes)."""
    blocks = getattr(container, "transformer_blocks", None) or []
    return [b for b in blocks if has_class_named(b, "BasicTransformerBlock")]
