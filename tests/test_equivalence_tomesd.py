"""With use_rand=False, tokenmerge computes what tomesd 0.1.3 computes (max |diff| <= 1e-5 x output scale)."""

from __future__ import annotations

import pytest
import tomesd
import torch

import tokenmerge
from conftest import LDM_SD15, build_ldm_unet, ldm_inputs, max_rel_diff, sd_inputs
from tokenmerge.architectures import build_unet

TOLERANCE = 1e-5
FLAGS = [(False, False), (True, False), (False, True), (True, True)]  # merge_crossattn, merge_mlp


def _compare(
    patch_target, run, ratio: float, merge_crossattn: bool, merge_mlp: bool, max_downsample: int = 1
) -> tuple[float, float]:
    """(max relative diff to tomesd, max relative diff of tomesd to vanilla)."""
    options = dict(
        ratio=ratio, use_rand=False, merge_crossattn=merge_crossattn, merge_mlp=merge_mlp, max_downsample=max_downsample
    )
    with torch.no_grad():
        vanilla = run()
        tomesd.apply_patch(patch_target, **options)
        reference = run()
        tomesd.remove_patch(patch_target)
        tokenmerge.apply_patch(patch_target, **options)
        ours = run()
        tokenmerge.remove_patch(patch_target)
    return max_rel_diff(ours, reference), max_rel_diff(reference, vanilla)


def _diffusers_run(unet, h, w, batch=2):
    inputs = sd_inputs(unet, h, w, batch=batch)
    # tomesd reads the latent size from the first positional argument.
    args = (inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"])
    return lambda: unet(*args).sample


def _ldm_run(unet, h, w, context_dim=32, batch=2):
    x, t, context = ldm_inputs(h, w, batch=batch, context_dim=context_dim)
    return lambda: unet(x, t, context=context)


@pytest.mark.parametrize("max_downsample", [1, 8])
@pytest.mark.parametrize("size", [(32, 32), (33, 49), (35, 23)])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.75])
@pytest.mark.parametrize("merge_crossattn,merge_mlp", FLAGS)
def test_diffusers_small_matches_tomesd(sd15_small, size, ratio, merge_crossattn, merge_mlp, max_downsample):
    run = _diffusers_run(sd15_small, *size)
    diff, effect = _compare(sd15_small, run, ratio, merge_crossattn, merge_mlp, max_downsample)
    assert diff <= TOLERANCE
    assert effect > 1e-3  # the comparison is not trivial: merging changed the output


# ldm's UNet itself needs latent sides divisible by 8; 24 and 56 give odd token grids (3, 7) at level 8.
@pytest.mark.parametrize("max_downsample", [1, 8])
@pytest.mark.parametrize("size", [(32, 32), (40, 24), (24, 56)])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.75])
@pytest.mark.parametrize("merge_crossattn,merge_mlp", FLAGS)
def test_ldm_small_matches_tomesd(ldm_small, size, ratio, merge_crossattn, merge_mlp, max_downsample):
    # tomesd needs the webui's object; tokenmerge accepts it too, so both patch the same wrapper.
    target, run = _webui_object_for(ldm_small), _ldm_run(ldm_small, *size)
    diff, effect = _compare(target, run, ratio, merge_crossattn, merge_mlp, max_downsample)
    assert diff <= TOLERANCE
    assert effect > 1e-3


def _webui_object_for(unet):
    holder = torch.nn.Module()
    holder.model = torch.nn.Module()
    holder.model.diffusion_model = unet
    return holder


@pytest.fixture(scope="module")
def sd15_full():
    return build_unet("sd15")


@pytest.fixture(scope="module")
def ldm_sd15_full():
    return build_ldm_unet(small=False)


@pytest.mark.slow
@pytest.mark.parametrize("size,merge_crossattn,merge_mlp", [((64, 64), False, False), ((64, 64), True, True), ((65, 97), False, False)])
def test_sd15_architecture_matches_tomesd(sd15_full, size, merge_crossattn, merge_mlp):
    diff, effect = _compare(sd15_full, _diffusers_run(sd15_full, *size, batch=1), 0.5, merge_crossattn, merge_mlp)
    assert diff <= TOLERANCE
    assert effect > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("size", [(64, 64)])
def test_ldm_sd15_architecture_matches_tomesd(ldm_sd15_full, size):
    run = _ldm_run(ldm_sd15_full, *size, context_dim=LDM_SD15["context_dim"], batch=1)
    diff, effect = _compare(_webui_object_for(ldm_sd15_full), run, 0.5, False, False)
    assert diff <= TOLERANCE
    assert effect > 1e-4
