"""Diffusion transformers: SD3 / SD3.5 (MMDiT), Flux (double/single-stream, rotary positions) and PixArt / DiT.

Tiny configs of the real diffusers classes. Text tokens are never reduced; image keys/values are downsampled
(todo/auto) or image tokens merged around attention and MLP (tome) on the patch grid, odd sizes included.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import TokenGrid, nearest_indices
from tokenmerge.tools.architectures import build_model, transformer_inputs

from conftest import AttentionCalls, shared

MODELS = ("sd3", "sd35", "flux", "pixart")
TEXT = 5


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: shared(build_model(name, small=True)) for name in MODELS}


def _inputs(name: str, model: torch.nn.Module, latent: tuple[int, int] = (18, 14), batch: int = 2, seed: int = 0) -> dict:
    return transformer_inputs(model, name, *latent, batch=batch, seed=seed, text_tokens=TEXT)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).sample


@contextlib.contextmanager
def attention_calls():
    """(query length, key length, key) of every SDPA call made in the block, filled when it closes."""
    mode, found = AttentionCalls(), []
    try:
        with mode:
            yield found
    finally:
        found.extend((q.shape[-2], k.shape[-2], k) for q, k, _ in mode.calls)


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs")


def _hooks(model) -> int:
    return sum(len(getattr(m, name)) for m in model.modules() for name in HOOK_DICTS)


@pytest.mark.parametrize("name", MODELS)
def test_identity_options_are_bit_identical_and_removal_restores(models, name):
    model = models[name]
    inputs = _inputs(name, model)
    vanilla = _run(model, inputs)
    hooks, attributes = _hooks(model), {id(m): set(vars(m)) for m in model.modules()}
    for options in (dict(ratio=0.0), dict(method="todo", kv_factor=1)):
        with tokenmerge.patched(model, **options):
            assert torch.equal(_run(model, inputs), vanilla)
    with tokenmerge.patched(model, ratio=0.5, merge_mlp=True):
        assert not torch.equal(_run(model, inputs), vanilla)
    assert torch.equal(_run(model, inputs), vanilla)
    assert _hooks(model) == hooks and {id(m): set(vars(m)) for m in model.modules()} == attributes


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("latent", [(18, 14), (16, 16)], ids=["9x7 grid", "8x8 grid"])
def test_todo_downsamples_image_keys_only(models, name, latent):
    model = models[name]
    inputs = _inputs(name, model, latent)
    h, w = latent[0] // 2, latent[1] // 2
    n, kept = h * w, ((h + 1) // 2) * ((w + 1) // 2)
    with tokenmerge.patched(model, method="todo", kv_factor=2), attention_calls() as calls:
        _run(model, inputs)
    joint = name != "pixart"
    text = TEXT if joint else 0
    image_calls = [(q, k) for q, k, _ in calls if q in (n, n + text) and (joint or k != TEXT)]  # not PixArt's cross-attention
    # Every image attention: the kept image keys plus all text keys (joint), or the kept image keys (SD3.5's attn2).
    assert image_calls and all(k == kept + (q - n) for q, k in image_calls)
    if not joint:  # PixArt's cross-attention to the text is untouched
        assert (n, TEXT) in [(q, k) for q, k, _ in calls]


@pytest.mark.parametrize("name", MODELS)
def test_tome_merges_image_tokens_and_never_text(models, name):
    model = models[name]
    inputs = _inputs(name, model, (16, 16))
    n = 64
    r = int(n * 0.5)
    with tokenmerge.patched(model, ratio=0.5), attention_calls() as calls:
        out = _run(model, inputs)
    text = TEXT if name != "pixart" else 0
    lengths = {q for q, k, _ in calls if q == k}  # self- and joint attention (not PixArt's cross-attention)
    assert n - r + text in lengths and lengths <= {n - r + text, n - r}  # merged image tokens (and all text, where joint)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "blocks", [dict(num_layers=1, num_single_layers=0), dict(num_layers=0, num_single_layers=1)], ids=["double-stream", "single-stream"]
)
def test_flux_downsampled_keys_keep_their_exact_rotary_positions(blocks):
    """Reference: vanilla attention's keys (after RoPE) at the positions nearest-exact downsampling keeps, the
    text keys untouched: exactly what the patched attention receives (first block: same inputs in both runs)."""
    import diffusers

    from tokenmerge.tools.architectures import unet_config

    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(**{**unet_config("flux", small=True), **blocks}).eval()
    inputs = _inputs("flux", model, (18, 14))
    with attention_calls() as vanilla_calls:
        _run(model, inputs)
    with tokenmerge.patched(model, method="todo", kv_factor=2), attention_calls() as calls:
        _run(model, inputs)
    keep = nearest_indices(TokenGrid((9, 7)), (2, 2), "nearest-exact", torch.device("cpu"))
    k_full, k = vanilla_calls[0][2], calls[0][2]
    expected = torch.cat([k_full[..., :TEXT, :], k_full[..., TEXT:, :].index_select(-2, keep)], dim=-2)
    assert torch.equal(k, expected)


def test_flux_merged_tokens_take_their_destinations_rotary_rows(models, recorded_plans):
    """The rotary table a merged attention gets: the text rows, then the image rows at the kept positions."""
    model = models["flux"]
    inputs = _inputs("flux", model, (16, 16))
    tables: list = []
    attentions = [m for m in model.modules() if type(m).__name__ == "FluxAttention"]
    _run(model, inputs)
    with tokenmerge.patched(model, ratio=0.5, merge_mlp=True):
        # Registered after the patch's hooks, so they see the table the attention processor gets.
        record = [
            a.register_forward_pre_hook(lambda m, args, kwargs: tables.append(kwargs["image_rotary_emb"]), with_kwargs=True)
            for a in attentions
        ]
        try:
            _run(model, inputs)
        finally:
            for handle in record:
                handle.remove()
    full = model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]]))
    assert len(recorded_plans) == 3 and all(p.batch_size == 2 for p in recorded_plans)  # a plan per sample
    # The shared table's placeholder holds sample 0's rows (hooks.tokens.SampleRows puts every sample's in its place).
    for plan, (cos, sin) in zip(recorded_plans, tables):
        rows = torch.cat([torch.arange(TEXT), TEXT + plan.keep_idx[0]])
        assert torch.equal(cos, full[0][rows]) and torch.equal(sin, full[1][rows])


@pytest.mark.parametrize("name", MODELS)
def test_keyword_calls_batch_sizes_and_determinism(models, name):
    model = models[name]
    with tokenmerge.patched(model, ratio=0.5, seed=3):
        for batch in (1, 2, 3):
            inputs = _inputs(name, model, batch=batch, seed=batch)
            first = _run(model, inputs)
            _run(model, _inputs(name, model, batch=2, seed=9))  # an unrelated call in between
            assert torch.equal(_run(model, inputs), first)
        single = _inputs(name, model, batch=1, seed=7)
        double = {
            k: (torch.cat([v, v]) if isinstance(v, torch.Tensor) and v.ndim and k not in ("img_ids", "txt_ids") else v)
            for k, v in single.items()
        }
        gap = (_run(model, double)[:1] - _run(model, single)).abs().max().item()
    assert gap < 1e-4  # an image's result does not depend on its batch


@pytest.mark.parametrize("name", ["sd3", "sd35", "pixart"])
@pytest.mark.parametrize(
    "options",
    [
        dict(ratio=0.5, merge_mlp=True),
        dict(method="todo", kv_factor=2),
        dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1),
    ],
)
def test_compiles_with_fullgraph(models, name, options):
    model = models[name]
    inputs = _inputs(name, model, (16, 16))
    with tokenmerge.patched(model, **options):
        try:
            eager = _run(model, inputs)
            with torch.no_grad():
                compiled = torch.compile(model, fullgraph=True, backend="eager")(**inputs).sample
        finally:
            torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)


def test_flux_compiles(models):
    """Flux reads its token grid from img_ids on the host (once per ids tensor): one graph break, still correct."""
    model = models["flux"]
    inputs = _inputs("flux", model, (16, 16))
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        try:
            eager = _run(model, inputs)
            with torch.no_grad():
                compiled = torch.compile(model, backend="eager")(**inputs).sample
        finally:
            torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("sd3", dict(max_downsample=2), "max_downsample=2 has no effect on the SD3 / SD3.5 transformer"),
        ("flux", dict(max_downsample=1), "max_downsample=1 has no effect on the Flux.1 transformer"),
        ("pixart", dict(max_downsample=4), "max_downsample=4 has no effect"),
        ("sd3", dict(merge_crossattn=True), "merge_crossattn=True has no effect on the SD3 / SD3.5 transformer"),
        ("flux", dict(merge_crossattn=True), "merge_crossattn=True has no effect on the Flux.1 transformer"),
    ],
)
def test_options_without_effect_on_a_transformer_are_rejected(models, name, options, match):
    with pytest.raises(ValueError, match=match):
        tokenmerge.apply_patch(models[name], **options)
    assert tokenmerge.get_config(models[name]) is None


def test_fused_projections_flux_and_pixart(models):
    for name in ("flux", "pixart"):
        model = build_model(name, small=True)
        inputs = _inputs(name, model, (16, 16))
        with tokenmerge.patched(model, method="todo", kv_factor=2):
            unfused = _run(model, inputs)
            model.fuse_qkv_projections()
            fused = _run(model, inputs)
        torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interpolation", ["nearest-exact", "area"])
def test_sd3_keys_from_downsampled_projections_equal_downsampled_keys(interpolation):
    """SD3's image keys/values are projected from downsampled tokens (fewer FLOPs); with fused projections they are
    downsampled at the attention call instead: the same keys up to float rounding (the maps commute)."""
    model = build_model("sd3", small=True)
    inputs = _inputs("sd3", model, (18, 14))
    with tokenmerge.patched(model, method="todo", kv_factor=2, kv_interpolation=interpolation):
        projected = _run(model, inputs)
        model.fuse_qkv_projections()  # FusedJointAttnProcessor2_0: no separate to_k / to_v calls
        at_attention = _run(model, inputs)
    torch.testing.assert_close(projected, at_attention, rtol=1e-4, atol=1e-5)
