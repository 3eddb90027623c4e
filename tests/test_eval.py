"""The quality yardstick: the training loop (a few steps on tiny data) and ``tokenmerge eval`` end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenmerge.tools.cli import main
from tokenmerge.tools.evaluate import compare, nearest_class_accuracy
from tokenmerge.tools.reference.models import SHIPPED, load_reference, read_metadata, shipped
from tokenmerge.tools.reference.photos import HELD_OUT, TRAINING, load_photo
from tokenmerge.tools.reference.train import TrainConfig, train
from tokenmerge.tools.specs import PatchSpec


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory) -> Path:
    """Runs the real training loop for two steps at 32 px on two photographs (CI never trains for real), then
    resumes it for a step of a content phase at the evaluation size (whole-photograph crops, shorter EMA), as
    `--res 64 --crop-scale 0.8 1 --ema 0.99` does."""
    out = tmp_path_factory.mktemp("ref")
    config = TrainConfig(kind="unet", out=str(out), steps=2, batch=2, log_every=1, structure_every=2, max_images=2, res=32)
    train(config, log=lambda *a, **k: None)
    content = {"steps": 3, "crop_scale": (0.8, 1.0), "ema": 0.99, "res": 64}
    train(TrainConfig(**{**config.__dict__, **content}), log=lambda *a, **k: None)  # resumes at step 2
    return out / "reference-unet.safetensors"


def test_training_writes_weights_log_and_resumes(tiny_reference):
    model = load_reference(tiny_reference)
    assert model.kind == "unet" and model.num_classes == 2 and model.class_names == [p.name for p in TRAINING[:2]]
    assert read_metadata(tiny_reference)["steps"] == "3" and read_metadata(tiny_reference)["train_res"] == "64"
    log = json.loads((tiny_reference.parent / "training.json").read_text())
    assert [step for step, *_ in log["losses"]] == [1, 2, 3] and all(np.isfinite(loss) for _, loss, _ in log["losses"])
    assert [s["step"] for s in log["structure"]] == [2] and 0 < log["structure"][0]["entropy"] <= 1


def test_a_resumed_run_logs_the_mean_of_the_steps_it_ran(tmp_path):
    # Stopped at step 1 of a 2-step logging window and resumed: the loss logged at step 2 is step 2's own
    # loss (the mean of the one step summed since the resume), not that loss halved.
    config = dict(kind="unet", batch=2, structure_every=0, max_images=2)
    train(TrainConfig(**config, out=str(tmp_path / "every"), steps=2, log_every=1), log=lambda *a, **k: None)
    train(TrainConfig(**config, out=str(tmp_path / "resumed"), steps=1, log_every=2), log=lambda *a, **k: None)
    train(TrainConfig(**config, out=str(tmp_path / "resumed"), steps=2, log_every=2), log=lambda *a, **k: None)
    every = json.loads((tmp_path / "every" / "training.json").read_text())["losses"]
    resumed = json.loads((tmp_path / "resumed" / "training.json").read_text())["losses"]
    assert [s for s, *_ in resumed] == [2] and resumed[0][1] == pytest.approx(every[1][1], rel=1e-5)


def test_a_run_continues_from_saved_weights_and_the_log_in_their_metadata(tiny_reference, tmp_path):
    # A fresh machine has only the saved weights: --init-from continues their run, history included.
    assert json.loads(read_metadata(tiny_reference)["log"])["step"] == 3
    config = TrainConfig(
        kind="unet", out=str(tmp_path), steps=4, batch=2, log_every=1, structure_every=0, max_images=2, init_from=str(tiny_reference)
    )
    weights = train(config, log=lambda *a, **k: None)
    log = json.loads((tmp_path / "training.json").read_text())
    assert [step for step, *_ in log["losses"]] == [1, 2, 3, 4] and log["optimizer_from"] == 3
    assert log["runs"][-1]["from_step"] == 3 and log["runs"][-1]["from_weights"] == tiny_reference.name
    assert read_metadata(weights)["steps"] == "4"
    train(TrainConfig(**{**config.__dict__, "steps": 5}), log=lambda *a, **k: None)  # its checkpoint wins over --init-from
    log = json.loads((tmp_path / "training.json").read_text())
    assert log["step"] == 5 and log["optimizer_from"] == 3 and "from_weights" not in log["runs"][-1]
    from tokenmerge.tools.reference.card import _run_count

    assert "at step 3 continued from the saved weights reference-unet.safetensors with a fresh optimiser" in _run_count(log)


@pytest.mark.parametrize("kind", ["flux", "sd3"])
def test_init_from_rejects_weights_it_cannot_continue(tiny_reference, tmp_path, kind):
    # flux: another kind than the file's; sd3: the shipped MMDiT file, saved before logs were embedded.
    source = tiny_reference if kind == "flux" else shipped("sd3")
    config = TrainConfig(
        kind=kind, out=str(tmp_path), steps=1, batch=2, structure_every=0, max_images=2 if kind == "flux" else 0, init_from=str(source)
    )
    with pytest.raises(ValueError, match="--init-from"):
        train(config, log=lambda *a, **k: None)


def test_model_card_is_generated_from_the_run(tiny_reference):
    from tokenmerge.tools.reference.card import finish

    path = finish(tiny_reference.parent, log=lambda *a: None, sample_steps=2)
    assert path == tiny_reference.with_suffix(".md")
    card = path.read_text()
    assert "Generated by `tokenmerge train-reference`" in card and "3 steps, batch 2" in card
    assert f"{os.cpu_count()} cores" in card and "in 2 run(s)" in card  # both invocations recorded where they ran
    assert "steps 0-2: 32 px, crops 0.25-1 of the shorter side, lr 0.001, EMA 0.999; steps 2-3: 64 px, crops 0.8-1" in card
    assert "Trained first at 32 px (cheaper steps), last at 64 px, the size it is evaluated at" in card
    assert "| trained | 500 |" in card and "| random twin | 500 |" in card and "Nearest-class check" in card
    assert tiny_reference.with_suffix(".png").exists()
    measured = json.loads(tiny_reference.with_suffix(".json").read_text())
    assert 0 <= measured["nearest_class_accuracy"] <= 1
    assert "Layout check" in card and measured["layout"]["flat_psnr"] > 0 and np.isfinite(measured["layout"]["psnr"])


@pytest.mark.parametrize("option", [{"crop_scale": (0.9, 0.5)}, {"crop_scale": (0.0, 1.0)}, {"ema": 1.0}, {"res": 40}, {"res": 8}])
def test_train_config_rejects_bad_options(option):
    with pytest.raises(ValueError, match=next(iter(option))):
        TrainConfig(**option)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_transformer_reference_models_train(tmp_path, kind):
    weights = train(
        TrainConfig(kind=kind, out=str(tmp_path), steps=1, batch=2, log_every=1, structure_every=1, max_images=2), log=lambda *a, **k: None
    )
    model = load_reference(weights)
    assert model.kind == kind
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64), torch.tensor(500), torch.tensor([0])).shape == (1, 3, 64, 64)


def test_photographs_come_from_installed_packages_and_two_are_held_out():
    names = [p.name for p in TRAINING]
    assert len(names) >= 15 and not set(names) & {p.name for p in HELD_OUT}
    for photo in (*TRAINING[:3], *HELD_OUT):
        image = load_photo(photo, 64)
        assert image.shape[0] == 3 and min(image.shape[1:]) == 64 and image.min() >= -1 and image.max() <= 1


def test_eval_on_a_reference_file_prints_table_structure_json_and_grid(tiny_reference, tmp_path, capsys):
    out, grid = tmp_path / "eval.json", tmp_path / "grid.png"
    argv = [
        "eval",
        "--model",
        str(tiny_reference),
        "--seeds",
        "2",
        "--steps",
        "2",
        "--size",
        "32",
        "--configs",
        "tome:0.5",
        "todo:2",
        "tomesd:0.5",
    ]
    assert main([*argv, "--json", str(out), "--grid", str(grid)]) == 0
    printed = capsys.readouterr().out
    assert "| tokenmerge r=0.5 |" in printed and "| tomesd 0.1.3 r=0.5 |" in printed and "| tokenmerge todo f=2 |" in printed
    assert "| trained | 500 |" in printed and "| random twin | 500 |" in printed
    assert "nearest training crop is from their own photograph" in printed
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"vanilla", "tokenmerge r=0.5", "tokenmerge todo f=2", "tomesd 0.1.3 r=0.5"}
    assert results["vanilla"]["speedup"] == 1.0
    assert np.isfinite(results["tokenmerge r=0.5"]["psnr_mean"]) and 0 < results["tokenmerge r=0.5"]["ssim_mean"] <= 1
    assert len(results["tokenmerge r=0.5"]["psnr_per_seed"]) == 2 and results["vanilla"]["psnr_per_seed"] == []  # for paired differences
    from PIL import Image

    assert Image.open(grid).size[0] == 4 * (32 + 2)  # vanilla + three configurations


def test_nearest_class_check_recognises_crops_of_the_photographs():
    g = torch.Generator().manual_seed(1)
    names = [p.name for p in TRAINING[:4]]
    images, labels = [], []
    for label, photo in enumerate(TRAINING[:4]):
        crop = load_photo(photo, 64)[:, :32, :32]
        images.append(((crop.permute(1, 2, 0).numpy() + 1) / 2).astype(np.float64))
        labels.append(label)
    assert nearest_class_accuracy(images, labels, names) >= 0.75
    noise = [np.random.default_rng(i).random((32, 32, 3)) for i in range(4)]
    assert nearest_class_accuracy(noise, labels, names) <= 0.75
    del g


def _tiny_pipeline(folder: Path) -> None:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from tokenmerge.tools.architectures import build_unet

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{f"{c}</w>": i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    vocab.update({c: len(vocab) + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
    (folder / "tok").mkdir(parents=True)
    (folder / "tok" / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tok" / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "tok" / "vocab.json"), str(folder / "tok" / "merges.txt"), model_max_length=77)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
        )
    )
    vae = AutoencoderKL(
        block_out_channels=[32] * 4,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        norm_num_groups=32,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=build_unet("sd15", small=True),
        scheduler=DDIMScheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder / "pipe")


def test_eval_on_a_local_pipeline_folder(tmp_path, capsys):
    _tiny_pipeline(tmp_path)
    out = tmp_path / "eval.json"
    argv = [
        "eval",
        "--model",
        str(tmp_path / "pipe"),
        "--seeds",
        "2",
        "--steps",
        "2",
        "--size",
        "128",
        "--configs",
        "tome:0.5",
        "tomesd:0.5",
        "--json",
        str(out),
    ]
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
        with pytest.raises(ValueError, match="tome:0.5, todo:2, auto, tokencache\\[:0.25\\] or tomesd:0.5|options are name=value"):
            PatchSpec.parse(bad)
    with pytest.raises(ValueError, match="reuse_steps"):
        PatchSpec.parse("tome:0.5,reuse_steps=0")


@pytest.mark.parametrize("kind", SHIPPED)
def test_shipped_reference_models_load_and_are_small(kind):
    path = shipped(kind)
    if not path.exists():
        pytest.skip(f"no shipped {kind} reference model")
    model = load_reference(path)
    assert model.num_classes >= 8
    assert path.stat().st_size < 20e6


def test_the_distilled_model_is_evaluated_at_its_own_steps_without_cfg(tmp_path, capsys):
    """``eval --model flux-distilled``: its 4 steps and no CFG by default (its metadata), a --guidance refused; the
    auto default's few-step rule reduces the last half of its steps (read from its calls)."""
    if not shipped("flux-distilled").exists():
        pytest.skip("no shipped flux-distilled reference model")
    out = tmp_path / "eval.json"
    argv = [
        "eval",
        "--model",
        "flux-distilled",
        "--seeds",
        "1",
        "--no-structure",
        "--configs",
        "auto,auto_max_keys=128,auto_min_tokens=256",
    ]
    assert main([*argv, "--json", str(out)]) == 0
    assert "4 distilled steps, no CFG" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert rows["meta"]["steps"] == 4 and rows["results"][1]["less_work"] > 1.0
    with pytest.raises(SystemExit, match="guidance-distilled"):
        main([*argv, "--guidance", "3"])


def test_a_configuration_identical_to_vanilla_summarises_and_plots(tmp_path):
    """A threshold cache that never fires gives images identical to vanilla's (inf dB): the summary says inf, not
    an error, and the frontier plot draws every group."""
    pytest.importorskip("matplotlib")
    from tokenmerge.tools.evaluate import Result, frontier_groups, save_frontier

    results = [
        Result("vanilla", seconds=2.0),
        Result("FirstBlockCache", psnr=[float("inf")] * 2, ssim=[1.0, 1.0], rel_l2=[0.0, 0.0], speedup=1.0),
        Result("tokenmerge r=0.5", psnr=[30.0, 32.0], ssim=[0.9, 0.92], rel_l2=[0.1, 0.1], speedup=1.5),
        Result("tokenmerge r=0.25", psnr=[35.0, 36.0], ssim=[0.95, 0.96], rel_l2=[0.05, 0.05], speedup=1.2),
        Result("tokenmerge auto + cache-dit DBCache", psnr=[25.0, 27.0], ssim=[0.8, 0.85], rel_l2=[0.2, 0.2], speedup=2.5),
    ]
    summary = results[1].summary()
    assert summary["psnr_mean"] == float("inf") and np.isnan(summary["psnr_std"])
    groups = frontier_groups(results)
    assert [r.name for r in groups["tokenmerge tome (ratio)"]] == ["tokenmerge r=0.25", "tokenmerge r=0.5"]  # by speed-up
    assert set(groups) == {"tokenmerge tome (ratio)", "step caches alone", "tokenmerge + cache-dit DBCache"}
    save_frontier(results, tmp_path / "frontier.png", "test", highlight=("tokenmerge r=0.5",))
    assert (tmp_path / "frontier.png").stat().st_size > 1000


def test_the_work_frontier_plots_eval_json_files(tmp_path, capsys):
    """`tokenmerge frontier` reads `eval --json` files: a panel per model and seed set, the token cache its own line."""
    pytest.importorskip("matplotlib")
    from tokenmerge.tools.evaluate import group_of

    def row(config: str, psnr: float, less_work: float) -> dict:
        return {"config": config, "psnr_mean": psnr, "psnr_std": 1.0, "less_work": less_work}

    meta = {"model": "flux", "steps": 28, "seeds": 8, "first_seed": 0}
    files = []
    for i, rows in enumerate(
        [
            [row("vanilla", float("inf"), 1.0), row("tokenmerge r=0.5", 15.6, 2.4), row("tokenmerge tokencache", 27.9, 2.8)],
            [row("tokenmerge tokencache 0.05 refresh_every=14 full_steps=2", 21.6, 5.3)],
        ]
    ):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps({"meta": meta, "results": rows}))
    out = tmp_path / "frontier.png"
    assert main(["frontier", *map(str, files), "--out", str(out), "--label", "tome:0.5"]) == 0
    assert out.stat().st_size > 1000 and "wrote" in capsys.readouterr().out
    assert group_of("tokenmerge tokencache 0.05 refresh_every=14 full_steps=2") == "tokenmerge tokencache (settings)"


def test_eval_without_the_photograph_packages_says_so_first_and_keeps_its_results(tiny_reference, tmp_path, capsys, monkeypatch):
    """After the README's `pip install -e ".[eval]"` the photographs' packages (installed --no-deps by .ci/run) may be
    missing: eval says so before it samples, naming the install, skips the photograph checks and still writes every
    result."""
    import tokenmerge.tools.reference.photos as photos

    monkeypatch.setattr(photos, "missing", lambda photos=None: {"sporco", "sklearn"})
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tiny_reference), "--seeds", "1", "--steps", "2", "--size", "32", "--configs", "tome:0.5"]
    assert main([*argv, "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "pip install --no-deps scikit-learn sporco==0.2.2.post1" in captured.err and "they are skipped" in captured.err
    assert "nearest training crop" not in captured.out and "| tokenmerge r=0.5 |" in captured.out
    assert {r["config"] for r in json.loads(out.read_text())["results"]} == {"vanilla", "tokenmerge r=0.5"}


def test_a_configuration_identical_to_vanilla_reads_identical_in_the_paired_table():
    from tokenmerge.tools.evaluate import Result, format_paired, paired_against

    results = [
        Result("vanilla"),
        Result("tokenmerge r=0.5", psnr=[30.0, 31.0]),
        Result("tokenmerge auto", psnr=[float("inf")] * 2),  # its default left every step whole
    ]
    table = format_paired(paired_against(results, "tokenmerge r=0.5"))
    assert "| tokenmerge auto | 2/2 seeds | identical to vanilla |" in table and "nan" not in table
