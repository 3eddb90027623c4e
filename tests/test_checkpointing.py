"""Guarantee: training through a patched model gives the gradients of the same computation without gradient
checkpointing, also when several forwards (other timesteps, other sizes) run before one backward.

Checkpointing recomputes blocks during backward, after later forwards have run; the recompute must use the
plan of the forward it recomputes (diffusers: non-reentrant ``torch.utils.checkpoint`` per block; ldm/sgm:
their own reentrant ``checkpoint`` of ``_forward``, the SD v1 yaml's default).
"""

from __future__ import annotations

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_unet

from conftest import build_ldm_unet, ldm_inputs, sd_inputs, shared

OPTIONS = [
    dict(ratio=0.5),
    dict(ratio=0.5, use_rand=False, merge_crossattn=True, merge_mlp=True),
    dict(ratio=0.5, share_plan=True),
    dict(method="todo", kv_factor=2),
    dict(method="auto", auto_max_keys=64, auto_min_tokens=64, max_noise=1),
]
# Two forwards before one backward: other timesteps, and (second case) another latent size.
CALLS = {"same size": [(16, 16, 900), (16, 16, 500)], "different sizes": [(16, 16, 900), (24, 16, 500)]}


def _grads(model, loss_fn) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss_fn().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_same_grads(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def unet():
    model = shared(build_unet("sd15", small=True))
    model.train()
    return model


@pytest.mark.parametrize("calls", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("options", OPTIONS)
def test_diffusers_gradient_checkpointing_gives_the_gradients_of_no_checkpointing(unet, options, calls):
    def loss() -> torch.Tensor:
        total = 0
        for h, w, t in calls:
            inputs = sd_inputs(unet, h, w, seed=h + w + t)
            total = total + unet(**dict(inputs, timestep=torch.tensor(t))).sample.square().mean()
        return total

    with tokenmerge.patched(unet, max_downsample=2, **options):
        plain = _grads(unet, loss)
        unet.enable_gradient_checkpointing()
        try:
            checkpointed = _grads(unet, loss)
        finally:
            unet.disable_gradient_checkpointing()
    vanilla = _grads(unet, loss)
    _assert_same_grads(checkpointed, plain)
    assert any(not torch.allclose(plain[n], vanilla[n]) for n in plain)  # the patch is active: gradients differ


@pytest.fixture(scope="module")
def ldm_unet():
    model = shared(build_ldm_unet(small=True))
    model.train()
    return model


def _set_ldm_checkpointing(model, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "checkpoint"):
            module.checkpoint = enabled
        if hasattr(module, "use_checkpoint"):
            module.use_checkpoint = enabled


@pytest.mark.parametrize("calls", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[1], OPTIONS[3]])
def test_ldm_reentrant_checkpointing_gives_the_gradients_of_no_checkpointing(ldm_unet, options, calls):
    # ldm's UNet needs sides divisible by 8.
    calls = [(h, w + (8 if w != h else 0), t) for h, w, t in calls]

    def loss() -> torch.Tensor:
        total = 0
        for h, w, t in calls:
            x, _, context = ldm_inputs(h, w, seed=h + w + t)
            x.requires_grad_(True)  # ldm's reentrant checkpoint needs an input that requires grad
            total = total + ldm_unet(x, torch.full((2,), float(t)), context=context).square().mean()
        return total

    with tokenmerge.patched(ldm_unet, max_downsample=2, **options):
        _set_ldm_checkpointing(ldm_unet, False)
        plain = _grads(ldm_unet, loss)
        _set_ldm_checkpointing(ldm_unet, True)
        checkpointed = _grads(ldm_unet, loss)
    _assert_same_grads(checkpointed, plain)


def test_whole_denoiser_checkpointed_per_step(unet):
    """Reward fine-tuning checkpoints each whole UNet call; the recompute replays that call's plans."""
    calls = [(16, 16, 900), (16, 16, 800)]

    def loss(checkpoint: bool) -> torch.Tensor:
        total = 0
        for h, w, t in calls:
            inputs = dict(sd_inputs(unet, h, w, seed=t), timestep=torch.tensor(t))
            run = lambda inputs=inputs: unet(**inputs).sample  # noqa: E731
            out = torch.utils.checkpoint.checkpoint(run, use_reentrant=False) if checkpoint else run()
            total = total + out.square().mean()
        return total

    with tokenmerge.patched(unet, ratio=0.5, reuse_steps=2):
        plain = _grads(unet, lambda: loss(False))
        checkpointed = _grads(unet, lambda: loss(True))
    _assert_same_grads(checkpointed, plain)
