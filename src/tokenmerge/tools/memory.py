"""What the token cache holds. :func:`cache_units`: across a generation, in machine-independent units (the most bytes
its caches held at once, over batch x image tokens x patched blocks x width x the model's element size: one token's
activations in every patched block), on the shipped reference models in the dtype a GPU runs them in (bfloat16).
:func:`published_bytes` and ``tokenmerge memory``: the bytes for every family's published model at its default size,
docs/tokencache.md's table."""

from __future__ import annotations

from typing import Any

import torch

import tokenmerge

from ..hooks import states_in


def cache_units(kind: str = "flux", dtype: torch.dtype = torch.bfloat16, steps: int = 28, seed: int = 0, **options: Any) -> dict[str, Any]:
    """One CFG generation of the ``kind`` reference model (batch 1 as a batch of 2) with the token cache under
    ``options``: the most bytes held after any of its calls, and those bytes in units (see the module)."""
    from .reference.models import load_reference, native_size, sample, shipped

    model = load_reference(shipped(kind)).to(dtype)
    size = native_size(kind)
    g = torch.Generator().manual_seed(seed)
    shape = (1, 3, 4, size, size) if model.is_video else (1, 3, size, size)
    noise = torch.randn(shape, generator=g).to(dtype)
    labels = torch.tensor([seed % model.num_classes])
    tokenmerge.apply_patch(model.denoiser, method="tokencache", **options)
    (state,) = [s for _, s in states_in([model.denoiser])]
    peak = {"bytes": 0, "tokens": 0, "batch": 0}

    def watch(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        held = state.cache_bytes()
        if held > peak["bytes"]:
            slots = [s for s in state.generations().slots if s.inputs]
            peak.update(bytes=held, tokens=max(t.shape[1] for s in slots for t in s.inputs.values()), batch=slots[0].key[0])

    handle = model.denoiser.register_forward_hook(watch, with_kwargs=True)
    try:
        sample(model, labels, noise, steps=steps)
    finally:
        handle.remove()
        tokenmerge.remove_patch(model.denoiser)
    config = model.denoiser.config
    width = config.num_attention_heads * config.attention_head_dim
    blocks = len(state.blocks)
    unit = peak["batch"] * peak["tokens"] * blocks * width * torch.empty((), dtype=dtype).element_size()
    return {**peak, "blocks": blocks, "width": width, "units": peak["bytes"] / unit if unit else 0.0}


# The size each table row is computed at: its pipeline's default (px height, width, video frames), else 1024 px.
SIZES: dict[str, tuple[int, int, int | None]] = {
    "cogvideox": (480, 720, 49),
    "cogvideox15": (768, 1360, 81),
    "hunyuanvideo": (720, 1280, 129),
    "hunyuanvideo15": (720, 1280, 121),
    "ltx": (512, 704, 161),
    "ltx2": (512, 768, 121),
    "wan": (480, 832, 81),
}
# One row per family (its examples' variants, image-to-video, VACE, ControlNets, hold what their base holds), and
# larger published models of one architecture: (label, example, config overrides).
ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("Flux.1-dev", "flux", {}),
    ("FLUX.2-dev", "flux2", {}),
    ("Flux.3", "flux3", {}),
    ("Chroma", "chroma", {}),
    ("SD3 Medium", "sd3", {}),
    ("SD3.5 Medium", "sd35", {}),
    ("Qwen-Image", "qwen-image", {}),
    ("HiDream-I1", "hidream", {}),
    ("Lumina 2", "lumina2", {}),
    ("Z-Image", "z-image", {}),
    ("PixArt-Σ", "pixart", {}),
    ("Wan 2.1 1.3B", "wan", {}),
    ("Wan 2.1 14B", "wan", {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}),
    ("HunyuanVideo", "hunyuanvideo", {}),
    ("HunyuanVideo 1.5", "hunyuanvideo15", {}),
    ("LTX-Video", "ltx", {}),
    ("LTX-2", "ltx2", {}),
    ("CogVideoX", "cogvideox", {}),
    ("CogVideoX 1.5", "cogvideox15", {}),
)
SETTINGS = {"default (int8)": {}, 'memory="low"': {"memory": "low"}}


def published_bytes(name: str, overrides: dict[str, Any] | None = None, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """What the token cache holds for one sample of the published model ``name`` (a bench example; ``overrides``:
    another published config of its architecture) at its default size (:data:`SIZES`), per setting of
    :data:`SETTINGS`: the bytes per image token and block its first blocks hold at full width after one full step
    (measured: every store as it is kept), times the published model's patched blocks and image tokens, plus one
    block input per token."""
    from ..describe import pixels_to_grid
    from ..families import family_of
    from .architectures import build_model, transformer_inputs
    from .examples import examples

    family, example = examples()[name]
    height, width, frames = SIZES.get(name, (1024, 1024, None))
    with torch.device("meta"):
        published = build_model(name, overrides=overrides)
    blocks = len(family_of(published).layout(published).blocks)
    tokens = pixels_to_grid(published, family.name, (height, width), frames).numel
    model = build_model(name, blocks=1, dtype=dtype, overrides=overrides)
    side = 4 * example.latent_multiple
    inputs = transformer_inputs(model, name, side, side, batch=1, frames=2 if example.frames else None)
    inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    found: dict[str, Any] = {"name": name, "size": (height, width, frames), "tokens": tokens, "blocks": blocks}
    for label, options in SETTINGS.items():
        tokenmerge.apply_patch(model, method="tokencache", **options)
        try:
            with torch.no_grad(), tokenmerge.generation(model):
                model(**inputs)
                (state,) = [s for _, s in states_in([model])]
                (slot,) = [g for g in state.generations().slots if g.inputs]
                held = slot.block_bytes()
        finally:
            tokenmerge.remove_patch(model)
        (grid_tokens,) = {t.shape[1] for t in slot.inputs.values()}
        per_block = [n for block, n in held.items() if block is not None]
        per_token = sum(per_block) / len(per_block) / grid_tokens
        found[label] = per_token * tokens * blocks + held[None] / grid_tokens * tokens
    return found


BEGIN = "<!-- memory: generated by `tokenmerge memory`; the bytes each store holds, measured at full width -->"
END = "<!-- end of memory -->"


def table() -> str:
    """docs/tokencache.md's table: every row of :data:`ROWS`, one sample per guidance slot."""
    rows = ["| model | size | image tokens | blocks | " + " | ".join(SETTINGS) + " |", "|---|---|---|---|" + "---|" * len(SETTINGS)]
    for label, name, overrides in ROWS:
        found = published_bytes(name, overrides)
        height, width, frames = found["size"]
        size = f"{height}×{width}" + (f" × {frames}" if frames else "")
        held = " | ".join(f"{found[s] / 1e9:.2f} GB" for s in SETTINGS)
        rows.append(f"| {label} | {size} | {found['tokens']:,} | {found['blocks']} | {held} |")
    return "\n".join(rows)


def write_docs(path: str) -> bool:
    """Put the current table between the markers of the page at ``path``; True if it changed."""
    from .support import write_between

    return write_between(path, BEGIN, END, f"{BEGIN}\n{table()}\n{END}")
