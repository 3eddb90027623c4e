"""The patched UNet traces as one graph under torch.compile(fullgraph=True): no graph breaks from tokenmerge.

The eager backend checks tracing (what fullgraph is about) without the minutes an inductor build takes on CPU.
"""

from __future__ import annotations

import pytest
import tomesd
import torch

import tokenmerge

from conftest import sd_inputs


@pytest.mark.parametrize(
    "options",
    [
        dict(ratio=0.5),
        dict(ratio=0.5, use_rand=False, merge_crossattn=True, merge_mlp=True),
        dict(method="todo"),
        dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1),
        dict(ratio=0.5, share_plan=True),
    ],
)
def test_patched_unet_compiles_with_fullgraph(sd15_small, options):
    inputs = sd_inputs(sd15_small, 16, 16)
    tokenmerge.apply_patch(sd15_small, **options)
    try:
        with torch.no_grad():
            eager = sd15_small(**inputs).sample
            compiled = torch.compile(sd15_small, fullgraph=True, backend="eager")(**inputs).sample
    finally:
        tokenmerge.remove_patch(sd15_small)
        torch._dynamo.reset()
    assert torch.equal(compiled, eager)


def test_tomesd_does_not_compile_with_fullgraph(sd15_small):
    """The contrast: tomesd's per-call hook state breaks the graph."""
    inputs = sd_inputs(sd15_small, 16, 16)
    tomesd.apply_patch(sd15_small, ratio=0.5)
    try:
        with torch.no_grad(), pytest.raises(Exception, match="RemovableHandle|Unsupported|graph break"):
            torch.compile(sd15_small, fullgraph=True, backend="eager")(
                inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"]
            )
    finally:
        tomesd.remove_patch(sd15_small)
        torch._dynamo.reset()


def test_patching_a_compiled_module_warns(sd15_small):
    """Graphs compiled before the patch ignore its hooks (torch skips hook guards by default): say so."""
    compiled = torch.compile(sd15_small, backend="eager")
    with pytest.warns(UserWarning, match="already wrapped by torch.compile"):
        tokenmerge.apply_patch(compiled, ratio=0.5)
    tokenmerge.remove_patch(compiled)
    assert tokenmerge.get_config(sd15_small) is None
