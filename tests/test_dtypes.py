"""fp32, fp16 and bf16 on CPU: merged models run in the model's dtype and stay close to fp32."""

from __future__ import annotations

import copy

import pytest
import torch

import tokenmerge

from conftest import attn1_token_counts, max_rel_diff, sd_inputs


@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 2e-2), (torch.bfloat16, 1e-1)])
def test_low_precision_runs_merged_and_close_to_fp32(sd15_small, dtype, tolerance):
    low = copy.deepcopy(sd15_small).to(dtype)
    inputs = sd_inputs(sd15_small)
    low_inputs = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.no_grad():
        tokenmerge.apply_patch(sd15_small, ratio=0.5, use_rand=False)
        tokenmerge.apply_patch(low, ratio=0.5, use_rand=False)
        reference = sd15_small(**inputs).sample
        with attn1_token_counts(low) as counts:
            out = low(**low_inputs).sample
        tokenmerge.remove_patch(sd15_small)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert 128 in counts
    assert max_rel_diff(out, reference) < tolerance
