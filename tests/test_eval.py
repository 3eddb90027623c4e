"""The quality yardstick: the training loop (a few steps on tiny data) and ``tokenmerge eval`` end to end."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenmerge.cli import main
from tokenmerge.evaluate import compare
from tokenmerge.variants import PatchSpec
from tokenmerge.reference import default_path, load_reference

ROOT = Path(__file__).parents[1]


def _train_module():
    spec = importlib.util.spec_from_file_location("train_reference", ROOT / "scripts" / "train_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory) -> Path:
    """Runs the real training script for two steps on two photographs (CI never trains for real)."""
    train = _train_module()
    out = tmp_path_factory.mktemp("ref") / "reference.safetensors"
    args = argparse.Namespace(
        out=str(out), minutes=5, steps=2, batch=2, res=16, sample_res=16, lr=1e-3, ema=0.9, cond_dropout=0.5, seed=0,
        log_every=1, checkpoint_minutes=10, max_images=2, samples=False,
    )
    train.train(args)
    return out


def test_training_smoke_run_writes_weights_card_and_loss_curve(tiny_reference):
    model = load_reference(tiny_reference)
    assert model.num_classes == 2 and len(model.class_names) == 2
    card = (tiny_reference.parent / "MODEL_CARD.md").read_text()
    assert "2 steps" in card and "photographs bundled with PyPI packages" in card
    losses = json.loads((tiny_reference.parent / "loss_curve.json").read_text())["step_loss"]
    assert [step for step, _ in losses] == [1, 2] and all(np.isfinite(loss) for _, loss in losses)


def test_photographs_come_from_installed_packages():
    images, names = _train_module().load_photographs(max_side=64)
    assert len(images) >= 8 and any(n.startswith("sklearn:") for n in names) and any(n.startswith("skimage:") for n in names)
    assert all(img.shape[0] == 3 and min(img.shape[1:]) == 64 and img.min() >= -1 and img.max() <= 1 for img in images)


def test_eval_on_a_reference_file_prints_table_json_and_grid(tiny_reference, tmp_path, capsys):
    out, grid = tmp_path / "eval.json", tmp_path / "grid.png"
    argv = ["eval", "--model", str(tiny_reference), "--seeds", "2", "--steps", "2", "--size", "16", "--configs", "tome:0.5", "todo:2", "tomesd:0.5"]
    assert main([*argv, "--json", str(out), "--grid", str(grid)]) == 0
    printed = capsys.readouterr().out
    assert "| tokenmerge r=0.5 |" in printed and "| tomesd 0.1.3 r=0.5 |" in printed and "| tokenmerge todo f=2 |" in printed
    assert "normalised entropy of top-level self-attention" in printed
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"vanilla", "tokenmerge r=0.5", "tokenmerge todo f=2", "tomesd 0.1.3 r=0.5"}
    assert results["vanilla"]["speedup"] == 1.0
    assert np.isfinite(results["tokenmerge r=0.5"]["psnr_mean"]) and 0 < results["tokenmerge r=0.5"]["ssim_mean"] <= 1
    from PIL import Image

    assert Image.open(grid).size[0] == 4 * (16 + 2)  # vanilla + three configurations


def _tiny_pipeline(folder: Path) -> None:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from tokenmerge.architectures import build_unet

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{f"{c}</w>": i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    vocab.update({c: len(vocab) + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
    (folder / "tok").mkdir(parents=True)
    (folder / "tok" / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tok" / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "tok" / "vocab.json"), str(folder / "tok" / "merges.txt"), model_max_length=77)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77)
    )
    vae = AutoencoderKL(block_out_channels=[32] * 4, down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4, norm_num_groups=32)
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=build_unet("sd15", small=True), scheduler=DDIMScheduler(),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(folder / "pipe")


def test_eval_on_a_local_pipeline_folder(tmp_path, capsys):
    _tiny_pipeline(tmp_path)
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tmp_path / "pipe"), "--seeds", "2", "--steps", "2", "--size", "128", "--configs", "tome:0.5", "tomesd:0.5", "--json", str(out)]
    assert main(argv) == 0
    assert "StableDiffusionPipeline, 128x128 px" in capsys.readouterr().out
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert 0 < results["tokenmerge r=0.5"]["rel_l2_mean"] < 1


def test_compare_metrics_and_config_parsing():
    a = np.random.default_rng(0).random((16, 16, 3))
    psnr, ssim, rel = compare(a, a)
    assert psnr == float("inf") and ssim == pytest.approx(1.0) and rel == 0
    _, ssim_noisy, rel_noisy = compare(np.clip(a + 0.1, 0, 1), a)
    assert ssim_noisy < 1 and rel_noisy > 0
    assert PatchSpec.parse("tome:0.5").name == "tokenmerge r=0.5"
    spec = PatchSpec.parse("tome:0.5,share_plan=true,reuse_steps=3,match_dtype=bfloat16")
    assert spec.kwargs() == {"method": "tome", "ratio": 0.5, "share_plan": True, "reuse_steps": 3, "match_dtype": "bfloat16"}
    assert PatchSpec.parse("auto").kwargs() == {"method": "auto"}
    assert PatchSpec.parse("todo:4").kwargs() == {"method": "todo", "kv_factor": 4}
    for bad in ("fast", "auto:2", "tome", "tome:0.5,shareplan=1", "tomesd:0.5,seed=1"):
        with pytest.raises(ValueError, match="tome:0.5, todo:2, auto or tomesd:0.5|options are name=value"):
            PatchSpec.parse(bad)
    with pytest.raises(ValueError, match="reuse_steps"):
        PatchSpec.parse("tome:0.5,reuse_steps=0")


def test_shipped_reference_model_loads():
    assert default_path().exists()
    model = load_reference()
    assert model.num_classes >= 8
    assert sum(p.numel() for p in model.parameters()) * 2 < 20e6  # fp16 file under ~20 MB
