"""The few-step yardstick (tokenmerge.tools.reference.distill): the student's targets reach the teacher's states
exactly, a run is resumable and saves a model sampled as its metadata says (its own steps, no CFG)."""

from __future__ import annotations

import pytest
import torch

from tokenmerge.tools.reference import distill
from tokenmerge.tools.reference.models import (
    alphas_cumprod,
    ddim_step,
    even_timesteps,
    load_reference,
    sample,
    sampler_timesteps,
    shipped,
)


def test_the_schedules_and_the_segments_targets_land_on_the_teachers_states():
    assert even_timesteps(4, 960) == (960, 720, 480, 240)
    assert even_timesteps(8, 960)[::2] == even_timesteps(4, 960)  # the 8-step schedule refines the 4-step one
    grid = even_timesteps(distill.TEACHER_STEPS, distill.T_MAX)
    states = torch.randn(3, distill.TEACHER_STEPS + 1, 3, 8, 8)
    labels = torch.tensor([0, 1, 2])
    alphas = alphas_cumprod()
    x, t, y, target = distill.segment_batch(states, labels, 24, torch.Generator().manual_seed(0))
    assert set(t.tolist()) <= set(grid) and set(y.tolist()) <= {0, 1, 2}
    for i in range(len(x)):
        n = next(j for j in range(3) if torch.equal(states[j, grid.index(int(t[i]))], x[i]))
        k = grid.index(int(t[i]))
        landed = [
            s
            for s in distill.STRIDES
            if k % s == 0
            and torch.allclose(
                ddim_step(x[i], target[i], alphas[int(t[i])], alphas[grid[k + s]] if k + s < len(grid) else 1.0),
                states[n, k + s],
                atol=1e-4,
            )
        ]
        assert landed, f"segment {i} from t={int(t[i])} reaches no teacher state"


@pytest.mark.slow
def test_a_run_resumes_and_saves_a_model_sampled_as_its_metadata_says(tmp_path, monkeypatch):
    if not shipped("flux").exists():
        pytest.skip("the Flux-style reference model (the teacher) is not in this checkout")
    monkeypatch.setattr(distill, "CHUNK", 1)
    config = distill.DistillConfig(out=str(tmp_path), trajectories=2, steps=2, batch=2, log_every=1)
    distill.distill(config, log=lambda *a, **k: None)
    assert len(list(tmp_path.glob("trajectories-*.pt"))) == 2
    again = distill.DistillConfig(out=str(tmp_path), trajectories=2, steps=3, batch=2, log_every=1)
    weights = distill.distill(again, log=lambda *a, **k: None)  # resumes: no new trajectories, one more step
    model = load_reference(weights)
    assert model.sampling["steps"] == 4 and model.sampling["guidance"] is None
    assert sampler_timesteps(model, 4) == (960, 720, 480, 240)
    noise = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    image = sample(model, torch.tensor([0]), noise, steps=4)
    assert image.shape == (1, 3, 64, 64) and image.abs().max() <= 1
    with pytest.raises(ValueError, match="guidance-distilled"):
        sample(model, torch.tensor([0]), noise, steps=4, guidance=3.0)
