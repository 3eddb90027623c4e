"""The video yardstick: clips made from the photographs, the Wan-style reference model's training loop (a few
steps on tiny data), its card, and ``tokenmerge eval --model video`` with per-frame PSNR and ``--baseline``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmerge.tools.cli import main
from tokenmerge.tools.evaluate import Result, compare, frame_psnr, paired_against
from tokenmerge.tools.reference.models import VIDEO_FRAMES, VIDEO_SIZE, load_reference, native_size, read_metadata
from tokenmerge.tools.reference.photos import TRAINING, load_photo, random_clips
from tokenmerge.tools.reference.structure import attention_stats
from tokenmerge.tools.reference.train import TrainConfig, train


@pytest.fixture(scope="module")
def photos() -> list[torch.Tensor]:
    return [load_photo(p, 96) for p in TRAINING[:3]]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), frames=st.integers(1, 6), res=st.sampled_from([8, 16]))
def test_clips_are_a_camera_moving_over_one_photograph(photos, seed, frames, res):
    clips, labels = random_clips(photos, 2, frames, res, torch.Generator().manual_seed(seed))
    assert clips.shape == (2, 3, frames, res, res) and labels.shape == (2,)
    assert clips.min() >= -1 - 1e-5 and clips.max() <= 1 + 1e-5
    if frames > 1:  # neighbouring frames are alike: far closer than two clips of different photographs are
        step = (clips[:, :, 1:] - clips[:, :, :-1]).abs().mean()
        assert step < 0.5


def test_clips_are_deterministic_and_temporally_redundant(photos):
    a, la = random_clips(photos, 4, 8, 16, torch.Generator().manual_seed(3))
    b, lb = random_clips(photos, 4, 8, 16, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(la, lb)
    step = (a[:, :, 1:] - a[:, :, :-1]).abs().mean()
    shuffled = (a[:, :, 1:] - a.roll(1, 0)[:, :, :-1]).abs().mean()  # the next frame of another clip
    assert step < 0.5 * shuffled


def test_structure_splits_distance_into_space_and_time():
    # Attention to the same position one frame away only: spatial distance 0, temporal distance 1 frame.
    grid, n = (3, 2, 2), 12
    logits = torch.full((n, n), -1e4)
    for i in range(n):
        logits[i, i + 4 if i < 8 else i - 4] = 0  # frames hold 4 tokens: the same row and column, a frame on
    q, k = logits[None, None], torch.eye(n)[None, None]  # q @ k^T = logits
    entropy, distance, _, time_distance, uniform_time = attention_stats([(q, k, 1.0)], grid, True)
    assert distance == pytest.approx(0, abs=1e-6) and time_distance == pytest.approx(1.0)
    assert uniform_time == pytest.approx(8 / 9)  # mean |t_i - t_j| over 3 frames
    assert 0 <= entropy < 0.05


@pytest.fixture(scope="module")
def tiny_video(tmp_path_factory) -> Path:
    """Two steps on 2-frame clips, then a resumed step on the 8 it is evaluated at (as `--frames 4` then `--frames 8`)."""
    out = tmp_path_factory.mktemp("video")
    config = TrainConfig(kind="video", out=str(out), steps=2, batch=2, log_every=1, structure_every=2, max_images=2, frames=2)
    train(config, log=lambda *a, **k: None)
    train(TrainConfig(**{**config.__dict__, "steps": 3, "frames": VIDEO_FRAMES, "ema": 0.99}), log=lambda *a, **k: None)
    return out / "reference-video.safetensors"


def test_video_reference_model_trains_resumes_and_samples_clips(tiny_video):
    model = load_reference(tiny_video)
    assert model.kind == "video" and model.is_video and native_size("video") == VIDEO_SIZE
    assert read_metadata(tiny_video)["steps"] == "3" and read_metadata(tiny_video)["train_res"] == str(VIDEO_SIZE)
    log = json.loads((tiny_video.parent / "training.json").read_text())
    assert [run["frames"] for run in log["runs"]] == [2, VIDEO_FRAMES]
    assert "time_ratio" in log["structure"][0] and 0 < log["structure"][0]["entropy"] <= 1
    with torch.no_grad():
        out = model(torch.randn(1, 3, 4, VIDEO_SIZE, VIDEO_SIZE), torch.tensor(500), torch.tensor([0]))
    assert out.shape == (1, 3, 4, VIDEO_SIZE, VIDEO_SIZE)


def test_video_card_reports_structure_in_space_and_time(tiny_video):
    from tokenmerge.tools.reference.card import finish

    card = finish(tiny_video.parent, log=lambda *a: None, sample_steps=2).read_text()
    assert "diffusers `WanTransformer3DModel`" in card and f"pixel space, clips of {VIDEO_FRAMES} frames at 32x32" in card
    assert "steps 0-2: 32 px, clips of 2 frames" in card and f"steps 2-3: 32 px, clips of {VIDEO_FRAMES} frames" in card
    assert f"Trained first at 32 px x 2 frames (cheaper steps), last at 32 px x {VIDEO_FRAMES} frames" in card
    assert "in time, frames (x uniform)" in card and "| random twin | 500 |" in card and "camera pans" in card
    from PIL import Image

    strip = Image.open(tiny_video.with_suffix(".png"))
    assert strip.size[0] == VIDEO_FRAMES * (VIDEO_SIZE + 2)  # one clip per row, frames left to right


def test_eval_on_the_video_model_reports_frames_and_a_paired_baseline(tiny_video, tmp_path, capsys):
    out, grid = tmp_path / "eval.json", tmp_path / "strips.png"
    argv = ["eval", "--model", str(tiny_video), "--seeds", "2", "--steps", "2", "--frames", "4", "--no-structure"]
    configs = ["--configs", "tome:0.5", "tome:0.5,st=2", "todo:2x1x1", "--baseline", "tome:0.5"]
    assert main([*argv, *configs, "--json", str(out), "--grid", str(grid)]) == 0
    printed = capsys.readouterr().out
    assert "32x32 px, 4 frames" in printed and "PSNR (dB) per frame" in printed and "| frame 3 |" in printed
    assert "paired against tokenmerge r=0.5" in printed and "/2 seeds |" in printed
    data = json.loads(out.read_text())
    assert data["meta"]["frames"] == 4 and data["meta"]["size"] == VIDEO_SIZE
    results = {r["config"]: r for r in data["results"]}
    assert len(results["tokenmerge r=0.5"]["psnr_per_frame"]) == 4
    assert {row["config"] for row in data["meta"]["paired"]} == set(results) - {"vanilla", "tokenmerge r=0.5"}
    from PIL import Image

    assert Image.open(grid).size[0] > 4 * VIDEO_SIZE


def test_frames_are_refused_for_image_models(capsys):
    with pytest.raises(SystemExit, match="--frames applies to the video reference model only"):
        main(["eval", "--model", "flux", "--frames", "4", "--seeds", "1"])


def test_clip_metrics_and_paired_differences():
    rng = np.random.default_rng(0)
    clip = rng.random((3, 16, 16, 3))
    noisy = clip.copy()
    noisy[2] = np.clip(noisy[2] + 0.2, 0, 1)  # only the last frame differs
    per_frame = frame_psnr(noisy, clip)
    assert per_frame[:2] == [float("inf")] * 2 and np.isfinite(per_frame[2])
    psnr, ssim, _ = compare(noisy, clip)
    assert psnr > per_frame[2] and ssim < 1  # the whole clip's error is a third of the last frame's
    a, b = Result("a", psnr=[30.0, 31.0, 29.0]), Result("b", psnr=[31.0, 30.0, 29.0])
    (row,) = paired_against([Result("vanilla"), a, b], "a")
    assert row["config"] == "b" and row["at_least_as_good"] == 2 and row["psnr_gap_per_seed"] == [1.0, -1.0, 0.0]
    with pytest.raises(ValueError, match="--baseline must be one of"):
        paired_against([Result("vanilla"), a], "tome")
