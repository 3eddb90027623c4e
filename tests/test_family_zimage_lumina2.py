"""Z-Image and Lumina2 beyond the conformance suite: per-sample caption lengths (masks), the image padding of
Z-Image, the refiners, and the calls that run unchanged (Lumina2 captions of different lengths, Z-Image omni)."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import Segment
from tokenmerge.families import lumina2, zimage
from tokenmerge.families.base import DECLINED
from tokenmerge.tools.architectures import build_model, transformer_inputs, transformer_output
from tokenmerge.tools.examples import lumina2 as lumina2_examples
from tokenmerge.tools.examples import zimage as zimage_examples

from conftest import AttentionCalls

METHODS = {"tome": dict(ratio=0.5), "todo": dict(method="todo", kv_factor=2)}
LATENT = (18, 14)  # 9 x 7 = 63 image tokens: Z-Image pads them to 64
_MODELS: dict[str, torch.nn.Module] = {}


def model_of(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = build_model(name, small=True)
    return _MODELS[name]


def zimage_inputs(lengths: tuple[int, ...], seed: int = 0) -> dict:
    return zimage_examples.inputs(model_of("z-image"), *LATENT, len(lengths), seed, 0, lengths=lengths)


def lumina2_inputs(lengths: tuple[int, ...], text: int = 16, seed: int = 0) -> dict:
    return lumina2_examples.inputs(model_of("lumina2"), *LATENT, len(lengths), seed, text, lengths=lengths)


def run(name: str, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return transformer_output(name, model_of(name)(**inputs))


def calls(name: str, inputs: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    mode = AttentionCalls()
    with mode:
        run(name, inputs)
    return mode.calls


def layout_of(name: str, inputs: dict):
    (state,) = [s for _, s in tokenmerge.hooks.states_in([model_of(name)])]
    return state.layout.containers[0].layout((), inputs)


def sample(inputs: dict, i: int) -> dict:
    """Sample ``i`` of a Z-Image call alone."""
    return {k: [v[i]] if isinstance(v, list) else v for k, v in inputs.items()}


# -- Z-Image -------------------------------------------------------------------------------------------------------
def test_zimage_layout_has_the_image_padding_as_a_segment_never_reduced():
    with tokenmerge.patched(model_of("z-image"), ratio=0.5):
        layout = layout_of("z-image", zimage_inputs((40, 5)))
        even = layout_of("z-image", zimage_examples.inputs(model_of("z-image"), 16, 16, 1, 0, 3))
    assert layout.segments == (Segment("image", 63, layout.grid), Segment(zimage.PADDING, 1), Segment("text", 64))
    assert layout.grid.shape == (9, 7) and layout.stream("image").total == 64 and layout.total == 128
    assert layout.references == () and layout.text_tokens == 64
    assert [s.kind for s in even.segments] == ["image", "text"] and even.total == 64 + 32


@pytest.mark.parametrize("method", list(METHODS))
def test_zimage_captions_of_different_lengths_mask_follows_and_samples_are_independent(method):
    """Captions of 40 and 5 tokens pad to 64 and 32: the main layers get a (B, S) mask over the batch padding. Each
    sample's result in the batch is its result alone (alone its call has no mask): the mask and the rotary rows
    followed the merge (or the key downsampling) per sample."""
    inputs = zimage_inputs((40, 5))
    vanilla, unpatched = calls("z-image", inputs), run("z-image", inputs)
    with tokenmerge.patched(model_of("z-image"), **METHODS[method]):
        patched = calls("z-image", inputs)
        batch = run("z-image", inputs)
        alone = torch.cat([run("z-image", sample(inputs, i)) for i in range(2)])
    assert (batch - alone).abs().max().item() < 1e-4
    assert not torch.equal(batch, unpatched) and torch.isfinite(batch).all()
    lengths = [(q0.shape[-2], q.shape[-2], k.shape[-2]) for (q0, _, _), (q, k, _) in zip(vanilla, patched)]
    # noise_refiner: 64 = 63 image + 1 padding; context_refiner: 64 caption tokens (untouched); main: 64 + 64
    if method == "tome":
        assert lengths == [(64, 33, 33), (64, 64, 64), (128, 97, 97), (128, 97, 97)]
    else:  # 9 x 7 -> 5 x 4 image keys
        assert lengths == [(64, 64, 21), (64, 64, 64), (128, 128, 85), (128, 128, 85)]


def test_zimage_omni_calls_and_images_of_different_sizes_run_unchanged_with_one_warning():
    model = model_of("z-image")
    base = zimage_inputs((8, 8))
    omni = {**base, "x": [[x] for x in base["x"]], "cap_feats": [[c] for c in base["cap_feats"]]}
    omni.update(siglip_feats=[None, None], image_noise_mask=[[1], [1]])
    sizes = {**base, "x": [base["x"][0], base["x"][1][..., :12]]}

    def samples(inputs: dict) -> list[torch.Tensor]:  # one (C, 1, H, W) per sample: sizes may differ
        with torch.no_grad():
            return model(**inputs)[0]

    for inputs, message in ((omni, "omni"), (sizes, "differ in size")):
        vanilla = samples(inputs)
        with tokenmerge.patched(model, ratio=0.5):
            with pytest.warns(UserWarning, match=message):
                assert all(map(torch.equal, samples(inputs), vanilla))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert all(map(torch.equal, samples(inputs), vanilla))  # warned once


# -- Lumina2 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(METHODS))
def test_lumina2_captions_of_different_lengths_run_unchanged_with_a_warning(method):
    inputs = lumina2_inputs((16, 9))
    vanilla = run("lumina2", inputs)
    with tokenmerge.patched(model_of("lumina2"), **METHODS[method]):
        with pytest.warns(UserWarning, match="different lengths"):
            assert torch.equal(run("lumina2", inputs), vanilla)
        assert layout_of("lumina2", inputs) is DECLINED


@pytest.mark.parametrize("method", list(METHODS))
def test_lumina2_padded_captions_of_equal_lengths_are_reduced(method):
    """Every sample has 9 valid tokens of 16 (right padding): the joint sequence is [9 text; 63 image]. The
    noise_refiner (image only) is reduced too, the context_refiner (the caption) is not."""
    name = "lumina2"
    inputs = lumina2_inputs((9, 9))
    vanilla = calls(name, inputs)
    with tokenmerge.patched(model_of(name), **METHODS[method]):
        layout = layout_of(name, inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            patched = calls(name, inputs)
            out = run(name, inputs)
    assert str(layout) == "text 9 ; image 9x7"
    assert not torch.equal(out, run(name, inputs)) and torch.isfinite(out).all()
    lengths = [(q0.shape[-2], q.shape[-2], k.shape[-2]) for (q0, _, _), (q, k, _) in zip(vanilla, patched)]
    if method == "tome":  # 31 of 63 image tokens merged
        assert lengths == [(16, 16, 16), (63, 32, 32), (72, 41, 41), (72, 41, 41)]
    else:  # 9 x 7 -> 5 x 4 image keys
        assert lengths == [(16, 16, 16), (63, 63, 20), (72, 72, 29), (72, 72, 29)]


def test_lumina2_samples_are_independent():
    inputs = lumina2_inputs((9, 9), seed=1)
    with tokenmerge.patched(model_of("lumina2"), ratio=0.5, seed=3):
        batch = run("lumina2", inputs)
        alone = torch.cat([run("lumina2", {k: v[i : i + 1] for k, v in inputs.items()}) for i in range(2)])
    assert (batch - alone).abs().max().item() < 1e-4


def test_layout_readers_pickle_without_their_warnings():
    readers = {"z-image": zimage.ZImageLayout(model_of("z-image")), "lumina2": lumina2.Lumina2Layout(model_of("lumina2"))}
    readers["z-image"].warned.add("omni")
    readers["lumina2"].warned = True
    inputs = {"z-image": zimage_inputs((40, 5)), "lumina2": lumina2_inputs((9, 9))}
    for name, reader in readers.items():
        loaded = pickle.loads(pickle.dumps(reader))
        assert not loaded.warned and loaded((), inputs[name]) == reader((), inputs[name])


def test_examples_run_as_their_pipelines_call_them():
    for name in ("z-image", "lumina2"):
        model = model_of(name)
        with torch.no_grad():
            out = transformer_output(name, model(**transformer_inputs(model, name, *LATENT, batch=2, text_tokens=5)))
        assert out.shape == (2, model.config.in_channels, *LATENT)
