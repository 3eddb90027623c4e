"""The ComfyUI node against ComfyUI's real UNet code (notcomfy), through ComfyUI's own patch points."""

from __future__ import annotations

import pytest
import torch

from tokenmerge.algorithms import TokenGrid
from tokenmerge.integrations.comfyui import REQUIRED, TokenMergeNode, token_grid, top_attention_level
from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run


@pytest.fixture(scope="module")
def sd15():
    return build_comfy_patcher("sd15-small")


@pytest.fixture(scope="module")
def sdxl():
    return build_comfy_patcher("sdxl-small")


def _inputs(batch=2, size=16, adm=None):
    g = torch.Generator().manual_seed(0)
    extra = {} if adm is None else {"y": torch.randn(batch, adm, generator=g)}
    return torch.randn(batch, 4, size, size, generator=g), torch.randn(batch, 7, 32, generator=g), extra


def _record_attention(patcher):
    """A clone whose last attn1 patch records (query tokens, key tokens) as self-attention receives them."""
    seen: list[tuple[int, int]] = []

    def record(n, context, value, extra_options):
        seen.append((n.shape[1], context.shape[1]))
        return n, context, value

    recorder = patcher.clone()
    recorder.set_model_attn1_patch(record)
    return recorder, seen


def test_ratio_zero_equals_unpatched_and_the_input_model_is_untouched(sd15):
    x, ctx, _ = _inputs()
    vanilla = comfy_run(sd15, x, context=ctx)
    (patched,) = TokenMergeNode().patch(sd15, ratio=0.0)
    assert torch.equal(comfy_run(patched, x, context=ctx), vanilla)
    (patched,) = TokenMergeNode().patch(sd15, ratio=0.5)
    assert not torch.equal(comfy_run(patched, x, context=ctx), vanilla)
    assert torch.equal(comfy_run(sd15, x, context=ctx), vanilla)  # the node patched a clone


def test_ratio_half_merges_queries_keys_and_values(sd15):
    x, ctx, _ = _inputs()
    vanilla = comfy_run(sd15, x, context=ctx)
    (patched,) = TokenMergeNode().patch(sd15, ratio=0.5, merge_crossattn=True)
    recorder, seen = _record_attention(patched)
    out = comfy_run(recorder, x, context=ctx)
    assert torch.isfinite(out).all() and out.shape == vanilla.shape
    assert (128, 128) in seen and (256, 256) not in seen  # top level: 16x16 tokens halved, K/V too
    assert (64, 64) in seen  # level 2 is left alone (auto level = 1)
    rel = ((out - vanilla).norm() / vanilla.norm()).item()
    assert 1e-4 < rel < 0.5


def test_builtin_tome_node_merges_only_queries(sd15):
    """The comparison point: ComfyUI's TomePatchModel keeps keys/values at full length."""
    from comfy_extras.nodes_tomesd import TomePatchModel

    x, ctx, _ = _inputs()
    (builtin,) = TomePatchModel().patch(sd15, 0.5)
    recorder, seen = _record_attention(builtin)
    comfy_run(recorder, x, context=ctx)
    assert (128, 256) in seen


def test_sdxl_shape_gets_level_two_automatically(sdxl):
    assert top_attention_level(sdxl) == 2
    x, ctx, extra = _inputs(adm=64)
    vanilla = comfy_run(sdxl, x, context=ctx, **extra)
    (patched,) = TokenMergeNode().patch(sdxl, ratio=0.5)
    recorder, seen = _record_attention(patched)
    out = comfy_run(recorder, x, context=ctx, **extra)
    assert (32, 32) in seen and (64, 64) not in seen  # level 2 has 8x8 tokens, merged to 32
    assert torch.isfinite(out).all() and not torch.equal(out, vanilla)
    with pytest.warns(UserWarning, match=r"no transformer block is merged: max_downsample=1 .* level is 2"):
        TokenMergeNode().patch(sdxl, ratio=0.5, max_downsample="1")


def test_deterministic_and_seeded(sd15):
    x, ctx, _ = _inputs()
    (a,) = TokenMergeNode().patch(sd15, ratio=0.5, seed=1)
    (b,) = TokenMergeNode().patch(sd15, ratio=0.5, seed=1)
    (c,) = TokenMergeNode().patch(sd15, ratio=0.5, seed=2)
    first = comfy_run(a, x, context=ctx)
    assert torch.equal(comfy_run(a, x, context=ctx), first)
    assert torch.equal(comfy_run(b, x, context=ctx), first)
    assert not torch.equal(comfy_run(c, x, context=ctx), first)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(ratio=1.0), ValueError, r"ratio must be a number in \[0, 1\)"),
        (dict(ratio=float("nan")), ValueError, "ratio must be"),
        (dict(sx=0), ValueError, "sx must be an int >= 1"),
        (dict(max_downsample="3"), ValueError, r"max_downsample must be None \(auto\) or a power of two"),
        (dict(use_rand="no"), TypeError, "use_rand must be True or False"),
        (dict(method="tokencache"), ValueError, "method='tokencache' runs on ComfyUI's diffusion transformers, around their blocks"),
    ],
)
def test_node_options_validate_with_clear_errors(sd15, kwargs, error, match):
    with pytest.raises(error, match=match):
        TokenMergeNode().patch(sd15, **kwargs)


def test_node_declares_its_inputs():
    inputs = TokenMergeNode.INPUT_TYPES()["required"]
    assert inputs["model"] == ("MODEL",)
    assert set(inputs) == {"model", *REQUIRED}  # (their order: tests/test_options.py)
    assert inputs["method"][0] == ["tome", "todo", "auto", "tokencache"]  # choices, not free text; the methods that run here
    # the other options are optional inputs: a workflow saved before them loads with their defaults (tests/test_options.py)
    assert list(TokenMergeNode.INPUT_TYPES()["optional"])[:5] == ["recompute", "refresh_every", "full_steps", "cache_dtype", "memory"]


def test_token_grid_recovers_odd_sizes():
    assert token_grid([1, 4, 65, 97], 65 * 97) == (TokenGrid((65, 97)), 1)
    assert token_grid([1, 4, 65, 97], 33 * 49) == (TokenGrid((33, 49)), 2)
    assert token_grid([1, 4, 65, 97], 1000) is None


def test_a_comfyui_checkout_is_not_silently_shadowed_by_notcomfy(tmp_path):
    """notcomfy's regular `comfy` package would win over a checkout's namespace package: importing refuses."""
    import subprocess
    import sys

    checkout = tmp_path / "ComfyUI"
    (checkout / "comfy").mkdir(parents=True)  # a checkout's comfy/ has no __init__.py
    (checkout / "comfy" / "model_management.py").write_text("")
    code = "from tokenmerge.tools.comfy_models import import_comfy\nimport_comfy()"
    env = {**__import__("os").environ, "COMFYUI_PATH": str(checkout)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "shadows the checkout" in result.stderr


def test_the_node_applied_twice_replaces_its_first_patch(sd15):
    import warnings

    x, ctx, _ = _inputs()
    (once,) = TokenMergeNode().patch(sd15, ratio=0.5)
    expected = comfy_run(once, x, context=ctx)
    (first,) = TokenMergeNode().patch(sd15, ratio=0.3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (twice,) = TokenMergeNode().patch(first, ratio=0.5)
        out = comfy_run(twice, x, context=ctx)
    messages = [str(w.message) for w in caught if "tokenmerge" in str(w.message)]
    assert messages == ["tokenmerge: this MODEL already carries a tokenmerge patch; it is replaced by this node's options"]
    assert torch.equal(out, expected)
    assert len(first.model_options["transformer_options"]["patches"]["attn1_patch"]) == 1  # the first clone keeps its own
