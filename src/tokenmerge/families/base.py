"""What a family module tells the generic hooks about one denoiser: its containers, blocks, and where tokens flow.

A family module (one per model family, see :mod:`tokenmerge.families`) finds the blocks and describes them with
the types below, mostly through the block patterns at the end (self+cross, joint stream, single stream); the
patcher attaches the same hooks to every family. Nothing here imports a model library: classes are recognised by
name along the MRO.

Streams: every tensor a hook sees is one of the sequences of the call's :class:`~tokenmerge.algorithms.TokenLayout`:
``"joint"`` (the whole sequence in the model's order: text, image, references), ``"image"`` (that sequence without
its text: a dual-stream block's image stream) or ``"target"`` (the generated image's tokens alone). Only the target
image segment is ever reduced.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller

LayoutReader = Callable[[tuple, dict], "TokenLayout | Declined | None"]  # picklable classes (ImageGrid, IdsLayout, ...)


class Declined:
    """What a layout reader returns for a call it will not lay out and has said why (its own one-time warning):
    the call runs unchanged and its blocks do not warn again (``None`` means "could not read", and they do)."""

    def __reduce__(self) -> str:
        return "DECLINED"


DECLINED = Declined()


def has_class_named(obj: object, *names: str) -> bool:
    """True if any class in ``obj``'s MRO has one of ``names``: no import of the model library needed."""
    return any(cls.__name__ in names for cls in type(obj).__mro__)


class Argument:
    """Reads (and replaces) argument ``name`` of ``module.forward`` in a hook's (args, kwargs), by keyword or by
    position (its position in the class's ``forward`` signature: gradient checkpointing calls blocks positionally)."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        params = [p for p in inspect.signature(type(module).forward).parameters.values() if p.name != "self"]
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.name = name
        self.position = names.index(name) if name in names else None

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.name in kwargs:
            return kwargs[self.name]
        return args[self.position] if self.position is not None and len(args) > self.position else None

    def replace(self, args: tuple, kwargs: dict, value: Any) -> tuple[tuple, dict]:
        if self.name in kwargs or self.position is None or len(args) <= self.position:
            return args, {**kwargs, self.name: value}
        return (*args[: self.position], value, *args[self.position + 1 :]), kwargs


@dataclass(frozen=True)
class Follow:
    """An argument of an attention module that must follow a merge of its tokens: a rotary table (Flux's
    ``image_rotary_emb``) or a mask over the sequence. Its rows along ``dim`` cover ``stream``; ``element`` picks
    one element of a tuple argument (Qwen-Image's ``(image table, text table)``: element 0 covers the image
    stream), ``None`` applies to the tensor or to every element of a tuple ((cos, sin))."""

    argument: str
    dim: int = 0
    stream: str = "joint"
    element: int | None = None


@dataclass
class Span:
    """Where one merged stretch of a block begins and ends: tokens are merged on entering ``enter`` (its input, or
    element ``enter_index`` of its output) and unmerged on leaving ``leave`` (its output, or element ``leave_index``
    of it). ``option`` (merge_attn / merge_crossattn / merge_mlp) switches it; ``stream`` is the sequence the
    merged tensor holds; ``follows``: (attention module, argument) pairs that must follow the merge."""

    option: str
    enter: torch.nn.Module
    leave: torch.nn.Module
    enter_on_output: bool = False
    enter_index: int | None = None
    leave_index: int | None = None
    stream: str = "image"
    follows: tuple[tuple[torch.nn.Module, Follow], ...] = ()
    name: str = ""


@dataclass
class KeyValueSite:
    """A self-attention (or joint attention) whose image keys and values ``method="todo"/"auto"`` downsample.

    ``stream``: the sequence its keys hold (the image tokens alone, or the joint sequence). ``context_kwarg``:
    for plain self-attention, the keyword through which a downsampled copy of the tokens can be handed to the
    unchanged attention as its key/value source (cheapest: the key and value projections then run on fewer
    tokens); ``projections`` does the same for a joint attention whose image keys and values have projections
    of their own; without either, or when the projections are fused, keys and values are downsampled at the
    attention call itself.
    """

    module: torch.nn.Module
    stream: str = "image"
    context_kwarg: str | None = None
    mask_kwarg: str | None = None
    # Key and value projections that see exactly the image tokens, with nothing position-dependent after them
    # (SD3's to_k / to_v): their inputs can be downsampled, so that they run on fewer tokens.
    projections: tuple[torch.nn.Module, ...] = ()


@dataclass(frozen=True)
class BlockOutput:
    """Declares that a block may run on a part of its input stream's image tokens alone (positions follow at its
    attentions; ``per_token``: the arguments that may have a row per token, which a gather at its entry cannot follow:
    where one has, the block keeps its spans), its output holding them at element ``index`` of the tuple it returns
    (None: the output is them). Where declared, a token
    cache keeps one residual per block (its output less its input) instead of each span's output: declared where that
    was measured to keep the quality of span outputs (Wan's three spans; on the Flux-style reference model, whose
    two spans are gated by the current step's modulation, it cost 3 dB)."""

    index: int | None = None
    per_token: tuple[str, ...] = ()


@dataclass
class BlockLayout:
    """One transformer block: its spans and key/value sites, how to read its input, and (``output``) whether it may
    run on gathered tokens as a whole."""

    module: torch.nn.Module
    spans: list[Span] = field(default_factory=list)
    kv_sites: list[KeyValueSite] = field(default_factory=list)
    input_name: str = "hidden_states"  # the tokens the matching is computed on (their image segment)
    input_stream: str = "image"
    recompute_method: str | None = None  # ldm/sgm: the method their own checkpoint re-runs in backward
    kind: str = ""  # for describe(): "BasicTransformerBlock", "JointTransformerBlock", ...
    output: BlockOutput | None = None


@dataclass
class Container:
    """A module whose blocks all see one token layout, read from its call by ``layout``; ``level`` is the grid's
    downsampling factor relative to the denoiser's input (1 at a UNet's top level and in a transformer)."""

    module: torch.nn.Module
    blocks: list[BlockLayout]
    level: int
    layout: LayoutReader


@dataclass
class DenoiserLayout:
    """A denoiser (UNet, transformer, ControlNet, ...) of one family and its containers, in execution order."""

    root: torch.nn.Module
    containers: list[Container]
    family: str  # the registry name of its family
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


# -- readers of a call's token layout -----------------------------------------------------------------------------
IMAGE_PLACES = ("after_text", "first", "last", "alone")


@dataclass(frozen=True)
class ComfyBlocks:
    """Where ComfyUI's block replace patches (``transformer_options["patches_replace"]["dit"][(kind, i)]``, called
    with the block's arguments and an ``original_block``) reach a family's blocks, for the methods whose spans
    run on gathered tokens on ComfyUI (:mod:`tokenmerge.integrations.comfyui.blocks`): each kind with the diffusion model's
    attribute listing its blocks; the kinds whose ``"img"`` argument is the joint [text; image] sequence (Flux's
    single-stream blocks); the token axes the ``"pe"`` rotary table may have (the first as long as the stream is taken:
    ComfyUI versions differ), its rows and a mask's columns [whatever precedes the stream; the stream], or with
    ``stream_first`` [the stream; whatever follows it] (empty ``pe_dims``: no table); ``wrapped``: a model without block
    patches whose layers' forwards tokenmerge wraps for the duration of each call."""

    lists: tuple[tuple[str, str], ...]  # (kind, diffusion_model attribute), e.g. ("double_block", "double_blocks")
    joint: tuple[str, ...] = ()
    pe_dims: tuple[int, ...] = ()
    # No replace patch reaches these blocks (NextDiT): their forwards are wrapped for each call of the model instead,
    # each called as ``layer(x, mask, rotary, modulation, ...)``
    wrapped: bool = False
    stream_first: bool = False  # rotary rows and mask columns [the stream; the text] (HunyuanVideo before 0.4)


@dataclass(frozen=True)
class ComfyModel:
    """How ComfyUI's own implementation of a family lays out its attention calls (the ComfyUI node's DiT path,
    :mod:`tokenmerge.integrations.comfyui.dit`): its diffusion-model classes (and, where one class serves several
    families, the ``image_model`` of ComfyUI's detected ``unet_config``: Flux.1 and Flux.2 are both ``Flux``), latent
    cells per token, where the image tokens sit in a self- or joint attention call, and the conditioning inputs
    that change the token grid (where present, the call runs unchanged: no wrong grid)."""

    classes: tuple[str, ...]  # ComfyUI's diffusion_model class names (comfy.ldm...), exact
    title: str
    # (height, width) or (frames, height, width) latent cells per token, where the model has no ``patch_size`` of its
    # own (the node reads the instance's first: Flux.2's 1x1 patches are the same class as Flux.1's 2x2)
    patch: tuple[int, ...] = (2, 2)
    # "after_text" ([text; image; references]), "first" ([image; text]), "last" ([extra; image]), "alone" (a self-attention
    # of the image tokens only: a call of another length is another stream's, LTX-2's audio)
    image: str = "after_text"
    declines: tuple[str, ...] = ()  # apply_model keywords that add tokens to the grid's rows or in front of it
    notes: str = ""  # what the override sees (docs/comfyui.md)
    image_models: tuple[str, ...] = ()  # the unet_config "image_model" values it claims (empty: any)
    blocks: ComfyBlocks | None = None  # where ToMe merges around its blocks (None: not offered, auto instead)
    # The instance attribute holding the multiple to which the caption and the image are each padded at their end,
    # the image last ([caption + pad; image + pad]: Z-Image's NextDiT); an instance with it set is this layout.
    padded_by: str = ""
    # An instance attribute set (not None) on this family's models only, where another family shares the class and its
    # image_model (HunyuanVideo 1.5's ``vision_in`` on ComfyUI's HunyuanVideo): an instance with it is this family's
    present: str = ""
    # Subclasses of its classes with another layout, not claimed: such a model runs unchanged with one notice (a
    # subclass is otherwise claimed by the nearest class of its MRO: Wan's VACE, ...)
    excludes: tuple[str, ...] = ()
    # A dotted attribute of the instance that, where true, puts the image first ([image; text]) whatever ``image`` says:
    # the same class has laid its tokens out both ways across ComfyUI versions (HunyuanVideo: flipped before 0.4)
    first_if: str = ""

    def of_instance(self, diffusion_model: Any) -> ComfyModel:
        """This layout as ``diffusion_model`` lays its tokens out (:attr:`first_if`)."""
        found: Any = diffusion_model
        for name in self.first_if.split(".") if self.first_if else ():
            found = getattr(found, name, None)
        if self.first_if and found is True:  # the older order: the image first in every call, its rows before the text's
            blocks = dataclasses.replace(self.blocks, stream_first=True) if self.blocks is not None else None
            return dataclasses.replace(self, image="first", first_if="", blocks=blocks)
        return self

    def pad_of(self, diffusion_model: Any) -> int:
        """The multiple this instance pads its caption and image to (1: none)."""
        value = getattr(diffusion_model, self.padded_by, None) if self.padded_by else None
        return value if isinstance(value, int) and value > 1 else 1

    def __post_init__(self) -> None:
        if self.image not in IMAGE_PLACES:
            raise ValueError(f"image must be one of {', '.join(IMAGE_PLACES)}, got {self.image!r}")

    @property
    def routes(self) -> tuple[str, ...]:
        """The routes into this model (:data:`tokenmerge.methods.ROUTES`): the attention override, and its block
        replace patches where it offers them."""
        return ("comfyui-dit", "comfyui-blocks") if self.blocks is not None else ("comfyui-dit",)

    def route_for(self, method: Any) -> str | None:
        """The route ``method`` (a :class:`tokenmerge.methods.Method`) runs on here: around the blocks where both
        allow it, else the override; None where neither does."""
        return next((route for route in reversed(self.routes) if route in method.routes), None)

    def patch_of(self, diffusion_model: Any) -> tuple[int, ...]:
        """Latent cells per token of this instance: its ``patch_size`` (an int: each spatial side; a sequence: its
        axes), else the declared :attr:`patch`."""
        size = getattr(diffusion_model, "patch_size", None)
        if isinstance(size, numbers.Integral):
            return (1, int(size), int(size))
        if isinstance(size, (tuple, list)) and size and all(isinstance(v, numbers.Integral) for v in size):
            return tuple(int(v) for v in size)
        return self.patch

    def image_start(self, tokens: int, n: int, text: int, pad: int = 1) -> int | None:
        """Where the ``n`` image tokens start among an attention call's ``tokens`` (None: not there). ``text``: the
        call's text length as the sampler passed it; a model that adds or pads text tokens has its image last.
        ``pad`` (:meth:`pad_of`, Z-Image): the caption and the image are each padded to a multiple of it, the image's
        padded block last; a call as long as the padded caption is its own refiner (an image-only call of that
        length is left whole too: the two cannot be told apart)."""
        if pad > 1:
            padded = -(-n // pad) * pad
            if tokens < padded or (text and tokens == -(-text // pad) * pad):
                return None
            return tokens - padded
        if tokens < n or (text and tokens == text):  # a text-only self-attention (Lumina's caption refiner)
            return None
        if self.image == "alone":
            return 0 if tokens == n else None
        if tokens == n or self.image == "first":
            return 0
        if self.image == "after_text" and 0 < text and text + n <= tokens:
            return text
        return tokens - n


def config_int(module: torch.nn.Module, name: str, default: int) -> int:
    config = getattr(module, "config", None)
    value = getattr(config, name, None) if config is not None else None
    return default if value is None else int(value)


class ImageGrid:
    """The image tokens alone: (H // p, W // p) of a (B, C, H, W) first input (``hidden_states`` / ``x`` /
    ``sample``); with ``text`` (a root argument) and ``order``, the joint sequence of a transformer whose blocks
    concatenate the text themselves (SD3: [image; text])."""

    def __init__(self, patch_size: int = 1, text: Argument | None = None, order: tuple[str, ...] = ("image",)) -> None:
        self.patch_size = patch_size
        self.text = text
        self.order = order

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = args[0] if args else next((kwargs[k] for k in ("hidden_states", "x", "sample") if k in kwargs), None)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            return None
        p = self.patch_size
        grid = TokenGrid((x.shape[-2] // p, x.shape[-1] // p), patch=(p, p))
        if self.text is None:
            return TokenLayout.image_only(grid)
        return TokenLayout.joint(self.order, grid, text_length(self.text(args, kwargs)))


class PerTokenTimestep:
    """Whether a call's ``timestep`` is per token (B, N): image-to-video models (Wan 2.2 TI2V, LTX-2) mark their
    first latent frame, the clean condition image, with timestep 0 that way (read from its shape: no host sync)."""

    def __init__(self, root: torch.nn.Module, name: str = "timestep") -> None:
        self.timestep = Argument(root, name)

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        t = self.timestep(args, kwargs)
        return isinstance(t, torch.Tensor) and t.ndim == 2


def video_layout(shape: tuple[int, int, int], patch: tuple[int, ...], condition_first: bool, text: int = 0) -> TokenLayout:
    """[video; text] over a (frames, h, w) token grid; with ``condition_first`` the first frame is a reference
    segment of its own (never reduced) and the later frames are the target."""
    frames, h, w = shape
    if condition_first and frames > 1:
        grid = TokenGrid((frames - 1, h, w), patch=patch)
        return TokenLayout.joint(("reference", "image", "text"), grid, text, (TokenGrid((1, h, w), patch=patch),))
    return TokenLayout.joint(("image", "text"), TokenGrid(shape, patch=patch), text)


class VideoGrid:
    """The video tokens of a (B, C, F, H, W) first input, patched by ``patch`` (frames, height, width): a
    ``(frames, h, w)`` grid (Wan, HunyuanVideo: frame-major, row-major within a frame). With
    ``first_frame_reference`` (a callable of the call's (args, kwargs)), the first latent frame is a reference
    segment of its own, never reduced, when it says so (Wan 2.2 TI2V: the clean image it animates). With ``text``
    (a root argument), the joint sequence [video; text] of a model whose blocks append the text themselves."""

    def __init__(
        self,
        patch: tuple[int, int, int],
        tokens: Argument | None = None,
        first_frame_reference: Callable[[tuple, dict], bool] | None = None,
        text: Argument | None = None,
    ) -> None:
        self.patch = tuple(patch)
        self.tokens = tokens
        self.first_frame_reference = first_frame_reference
        self.text = text

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs) if self.tokens is not None else (args[0] if args else kwargs.get("hidden_states"))
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        pt, ph, pw = self.patch
        frames, h, w = x.shape[2] // pt, x.shape[3] // ph, x.shape[4] // pw
        text = 0 if self.text is None else text_length(self.text(args, kwargs))
        condition = self.first_frame_reference is not None and self.first_frame_reference(args, kwargs)
        return video_layout((frames, h, w), self.patch, condition, text)


class PackedVideoGrid:
    """The (frames, h, w) grid of packed video tokens (B, N, C) from the call's ``num_frames``, ``height``, ``width``
    (LTX-Video, LTX-2: latent sizes, over the patch sizes); a per-token timestep makes the first frame a reference."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens = Argument(root, "hidden_states")
        self.sizes = [Argument(root, name) for name in ("num_frames", "height", "width")]
        self.patch = (root.config.patch_size_t, root.config.patch_size, root.config.patch_size)
        self.first_frame_reference = PerTokenTimestep(root)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, sizes = self.tokens(args, kwargs), [read(args, kwargs) for read in self.sizes]
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or not all(isinstance(s, numbers.Integral) for s in sizes):
            return None
        shape = tuple(int(s) // p for s, p in zip(sizes, self.patch))
        if math.prod(shape) != x.shape[1]:
            return None
        return video_layout(shape, self.patch, self.first_frame_reference(args, kwargs))


def text_length(text: Any) -> int:
    """Tokens of a (B, S, C) text tensor (0 for None)."""
    return text.shape[1] if isinstance(text, torch.Tensor) and text.ndim == 3 else 0


# -- block patterns ----------------------------------------------------------------------------------------------
def attention_self_kwargs(attention: torch.nn.Module) -> tuple[str | None, str | None]:
    """(context keyword, mask keyword) that this attention class's forward takes, if any."""
    params = inspect.signature(type(attention).forward).parameters
    context = next((n for n in ("encoder_hidden_states", "context") if n in params), None)
    mask = next((n for n in ("attention_mask", "mask") if n in params), None)
    return context, mask


def basic_block(module: torch.nn.Module, recompute_method: str | None = None) -> BlockLayout:
    """Self-attention, cross-attention, MLP (``BasicTransformerBlock`` of diffusers, ldm, sgm; PixArt's blocks):
    attn1 / attn2 / ff, each a merged span of its own; attn1's keys and values are downsampled."""
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


def self_cross_block(
    block: torch.nn.Module,
    *,
    names: tuple[str, str, str] = ("attn1", "attn2", "ffn"),
    follows: tuple[Follow, ...] = (),
    input_name: str = "hidden_states",
    output: BlockOutput | None = None,
) -> BlockLayout:
    """A DiT block of self-attention, cross-attention to the text and MLP on the image tokens alone, with positions
    applied inside the self-attention (Wan's rotary ``(cos, sin)``): each sub-layer a merged span of its own, the
    self-attention's ``follows`` gathered with the merge, its keys and values reduced at the attention call (after
    the rotary embedding). ``input_name``: the block argument the tokens are matched on; ``output``: see
    :class:`BlockOutput`."""
    spans = []
    for name, option in zip(names, ("merge_attn", "merge_crossattn", "merge_mlp")):
        sub = _module(block, name)
        if sub is not None:
            bound = tuple((sub, f) for f in follows) if option == "merge_attn" else ()
            spans.append(Span(option, sub, sub, follows=bound, name=name))
    kv = [KeyValueSite(_module(block, names[0]), stream="image")]
    return BlockLayout(block, spans, kv, input_name=input_name, kind=type(block).__name__, output=output)


def _module(block: torch.nn.Module, name: str | None) -> torch.nn.Module | None:
    found = getattr(block, name, None) if name else None
    return found if isinstance(found, torch.nn.Module) else None


def key_value_projections(attention: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """An attention's image key and value projections where the text has projections of its own
    (``add_k_proj`` / ``add_v_proj``) and only a per-token qk-norm follows (SD3): their inputs can be downsampled."""
    projections = tuple(getattr(attention, name, None) for name in ("to_k", "to_v"))
    return projections if all(isinstance(p, torch.nn.Module) for p in projections) else ()


def joint_block(
    block: torch.nn.Module,
    *,
    attention: str = "attn",
    attention_output: int | None = 0,
    image_attention: str | None = None,
    mlps: tuple[str, ...] = ("ff",),
    follows: tuple[Follow, ...] = (),
    projections: bool = False,
) -> BlockLayout:
    """A dual-stream block (MMDiT): image and text streams with their own weights meet in one joint attention.

    The image stream is merged around ``attention`` (its image output is element ``attention_output``), around an
    image-only ``image_attention`` (SD3.5's attn2) and around each image MLP in ``mlps``; the text stream runs as it
    is. ``follows``: the attention's arguments that must follow the merge (rotary tables, masks); ``projections``:
    the image key/value projections may see downsampled tokens (SD3)."""
    attn = getattr(block, attention)
    bound = tuple((attn, f) for f in follows)
    spans = [Span("merge_attn", attn, attn, leave_index=attention_output, follows=bound, name=attention)]
    kv = [KeyValueSite(attn, stream="joint", projections=key_value_projections(attn) if projections else ())]
    second = _module(block, image_attention)
    if second is not None:
        spans.append(Span("merge_attn", second, second, name=image_attention))
        kv.append(KeyValueSite(second, stream="image", projections=key_value_projections(second) if projections else ()))
    for name in mlps:
        mlp = _module(block, name)
        if mlp is not None:
            spans.append(Span("merge_mlp", mlp, mlp, name=name))
    return BlockLayout(block, spans, kv, kind=type(block).__name__)


def single_stream_block(
    block: torch.nn.Module,
    *,
    enter: str = "norm",
    enter_index: int | None = 0,
    leave: str = "proj_out",
    attention: str = "attn",
    input_stream: str = "image",
    follows: tuple[Follow, ...] = (),
) -> BlockLayout:
    """A single-stream block (Flux's): attention and MLP in parallel on one normalised joint sequence, merged from
    ``enter``'s output (element ``enter_index``) to ``leave``'s output. ``input_stream``: what the block's
    ``hidden_states`` hold (the image alone, when the block concatenates the text itself, or the joint sequence)."""
    attn = getattr(block, attention)
    span = Span(
        "merge_attn",
        getattr(block, enter),
        getattr(block, leave),
        enter_on_output=True,
        enter_index=enter_index,
        stream="joint",
        follows=tuple((attn, f) for f in follows),
        name="attn+mlp",
    )
    return _single_span_block(block, span, attn, input_stream)


def fused_parallel_block(
    block: torch.nn.Module,
    *,
    attention: str = "attn",
    input_stream: str = "joint",
    follows: tuple[Follow, ...] = (),
) -> BlockLayout:
    """A single-stream block whose MLP is fused into its attention module (Flux.2's parallel self-attention): the
    module takes the normalised joint sequence and returns attention and MLP together, so one span covers it."""
    attn = getattr(block, attention)
    span = Span("merge_attn", attn, attn, stream="joint", follows=tuple((attn, f) for f in follows), name=f"{attention} (+mlp)")
    return _single_span_block(block, span, attn, input_stream)


def _single_span_block(block: torch.nn.Module, span: Span, attn: torch.nn.Module, input_stream: str) -> BlockLayout:
    """A single-stream block: one merged span over the joint sequence, its attention's keys and values reducible."""
    return BlockLayout(block, [span], [KeyValueSite(attn, stream="joint")], input_stream=input_stream, kind=type(block).__name__)


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


class HostReads:
    """What a layout reader computed from a tensor by a host read (a sync with the device), kept while the same data
    is passed again: pipelines pass one ids tensor at every step, so the read happens once per generation.

    The data is known by its address, shape, strides and device, with the tensor held (so that its memory cannot be
    reused by another tensor while it is kept) and its version counter, which an in-place change bumps. Inference
    tensors (made under ``torch.inference_mode()``, as pipelines and ComfyUI make them) have no version counter: for
    them the address alone counts (they can only be changed in place inside inference mode, which a pipeline does not
    do to the ids it passes)."""

    def __init__(self) -> None:
        self._last: tuple[torch.Tensor, tuple, Any] | None = None

    def __call__(self, t: torch.Tensor, read: Callable[[torch.Tensor], Any]) -> Any:
        version = None if t.is_inference() else t._version
        key = (t.data_ptr(), version, tuple(t.shape), t.stride(), str(t.device))
        last = self._last
        if last is None or last[1] != key:
            last = self._last = (t, key, read(t))
        return last[2]

    def __getstate__(self) -> dict:
        return {"_last": None}


class IdsLayout:
    """The layout of a call whose image tokens carry position ids (Flux.1, Flux.2, Chroma): ``ids`` (S, k) or
    (B, S, k) rows with the token's row and column in columns ``row`` / ``col`` and, in column ``segment``, which
    image it belongs to (the target, then reference images for edits, as Kontext and Flux.2 append them). The text
    length is read from ``text``. One host sync per distinct ids tensor (pipelines pass the same one every step)."""

    def __init__(
        self,
        root: torch.nn.Module,
        order: tuple[str, ...],
        ids: str = "img_ids",
        text: str = "encoder_hidden_states",
        tokens: str = "hidden_states",
        row: int = 1,
        col: int = 2,
        segment: int = 0,
    ) -> None:
        self.ids, self.text, self.tokens = Argument(root, ids), Argument(root, text), Argument(root, tokens)
        self.order, self.row, self.col, self.segment = order, row, col, segment
        self.warned = False
        self.reads = HostReads()

    def _grids(self, ids: torch.Tensor) -> tuple[TokenGrid, ...] | None:
        rows = ids[:, [self.segment, self.row, self.col]].round().long().tolist()
        grids, start = [], 0
        while start < len(rows):
            end = start
            while end < len(rows) and rows[end][0] == rows[start][0]:
                end += 1
            part = rows[start:end]
            r0, c0 = min(r for _, r, _ in part), min(c for _, _, c in part)
            h, w = max(r for _, r, _ in part) - r0 + 1, max(c for _, _, c in part) - c0 + 1
            if h * w != len(part) or any((r - r0) * w + (c - c0) != i for i, (_, r, c) in enumerate(part)):
                return None
            grids.append(TokenGrid((h, w)))
            start = end
        return tuple(grids)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        ids, x = self.ids(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(ids, torch.Tensor) or not isinstance(x, torch.Tensor) or x.ndim != 3:
            return None
        if ids.ndim == 3:
            ids = ids[0]
        grids = self.reads(ids, self._grids) if ids.shape[0] == x.shape[1] else None
        if grids is None:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    f"tokenmerge: the {x.shape[1]} image tokens' ids do not form row-major grids (one per image); such calls run unchanged",
                )
            return DECLINED
        return TokenLayout.joint(self.order, grids[0], text_length(self.text(args, kwargs)), grids[1:])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}
