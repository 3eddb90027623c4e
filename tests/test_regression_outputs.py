"""The families that existed before the family registry give the outputs recorded from that code (0.2.0).

Recorded on one CPU; another CPU's kernels may round differently, so the comparison allows float noise far
below what any method changes (each method moves these outputs by 1e-2 or more, relative). On the machine that
recorded them the outputs are bit-identical (``TOKENMERGE_EXACT=1`` asserts that).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

import tokenmerge

import regression_cases

RECORDED = load_file(str(regression_cases.FIXTURE))


@pytest.mark.parametrize("name", regression_cases.MODELS)
def test_existing_families_give_their_recorded_outputs(name):
    model = regression_cases.build(name)
    args, kwargs = regression_cases.inputs(name, model)
    vanilla = regression_cases.run(model, args, kwargs)
    for method, options in regression_cases.METHODS.items():
        with tokenmerge.patched(model, **options):
            out = regression_cases.run(model, args, kwargs)
        expected = RECORDED[f"{name}/{method}"]
        if os.environ.get("TOKENMERGE_EXACT"):
            assert torch.equal(out, expected), f"{name}/{method}"
        scale = expected.abs().max()
        assert (out - expected).abs().max() <= 1e-5 * scale, f"{name}/{method}"
        assert (out - vanilla).abs().max() > 1e-3 * scale, f"{name}/{method} does nothing"
