"""Key/value downsampling reaches every diffusers attention backend (``dispatch_attention_fn``), not only SDPA.

CPU backends run for real (native, _native_math, flex); a GPU-only backend (flash) is replaced by a stand-in with
its keyword call, registered where diffusers looks it up, to show that the reduction sits in front of whichever
function the registry holds. The route is removed with the last patch.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

import tokenmerge
from tokenmerge.hooks import dispatch
from tokenmerge.tools.architectures import build_model, transformer_inputs

TODO = dict(method="todo", kv_factor=2)


@pytest.fixture(scope="module")
def flux():
    return build_model("flux", small=True)


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _set_backend(model, backend: AttentionBackendName | None) -> None:
    for m in model.modules():
        processor = getattr(m, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            processor._attention_backend = backend


@pytest.mark.parametrize("backend", ["native", "_native_math", "flex"])
def test_cpu_backends_get_the_same_reduced_keys(flux, backend):
    inputs = transformer_inputs(flux, "flux", 16, 16, text_tokens=5)
    with tokenmerge.patched(flux, **TODO):
        reference = _run(flux, inputs)  # the default backend
    _set_backend(flux, AttentionBackendName(backend))
    try:
        vanilla = _run(flux, inputs)
        with tokenmerge.patched(flux, **TODO):
            reduced = _run(flux, inputs)
    finally:
        _set_backend(flux, None)
    torch.testing.assert_close(reduced, reference, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(reduced, vanilla, rtol=1e-4, atol=1e-5)


def test_a_gpu_backend_stand_in_receives_reduced_keys(flux, monkeypatch):
    """flash's registry entry replaced by a stand-in that takes what diffusers passes a flash kernel: keywords on
    (B, S, H, D) tensors; the key lengths it saw are the reduced ones."""
    seen: list[int] = []

    def flash_stand_in(query, key, value, **kwargs):
        seen.append(key.shape[1])
        out = torch.nn.functional.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        return out.transpose(1, 2)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, AttentionBackendName.FLASH, flash_stand_in)
    inputs = transformer_inputs(flux, "flux", 16, 16, text_tokens=5)
    _set_backend(flux, AttentionBackendName.FLASH)
    try:
        _run(flux, inputs)
        full = set(seen)
        seen.clear()
        with tokenmerge.patched(flux, **TODO):
            _run(flux, inputs)
    finally:
        _set_backend(flux, None)
    assert full == {5 + 64} and set(seen) == {5 + 16}  # text keys kept, 8x8 image keys -> 4x4


def test_the_route_is_removed_with_the_last_patch(flux):
    before = dispatch.wrapped()
    a, b = build_model("flux", small=True), build_model("sd3", small=True)
    tokenmerge.apply_patch(a, **TODO)
    tokenmerge.apply_patch(b, **TODO)
    assert dispatch.wrapped()
    tokenmerge.remove_patch(a)
    assert dispatch.wrapped()
    tokenmerge.remove_patch(b)
    assert dispatch.wrapped() == before
    assert all(getattr(f, "_tokenmerge_wrapped", None) is None for f in _AttentionBackendRegistry._backends.values()) or before


def test_a_processor_with_its_own_kernel_is_named_at_apply_time():
    """SD3's joint attention under xFormers' processor: its keys are computed inside the processor and attention
    runs outside both routes, so todo would do nothing there: said at apply_patch, not per block at run time."""
    from diffusers.models.attention_processor import XFormersJointAttnProcessor

    model = build_model("sd3", small=True)
    model.set_attn_processor(XFormersJointAttnProcessor())
    with pytest.warns(UserWarning, match="XFormersJointAttnProcessor compute attention another way"):
        tokenmerge.apply_patch(model, method="todo")
    tokenmerge.remove_patch(model)
