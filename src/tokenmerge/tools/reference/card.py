"""The model card of a reference model, generated from its run (never edited by hand).

``finish(run)`` measures what the card reports — the attention structure of the trained model and of its
randomly initialised twin on noised held-out photographs, a sample grid, and how many samples look like
their class — and writes the card, the samples and the measurements beside the weights, named after them
(``reference-unet.md``, ``reference-unet.png``, ``reference-unet.json``), so that the four files ship together.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from .models import CONFIGS, IMAGE_SIZE, VIDEO_FRAMES, ReferenceModel, backbone_class, load_reference, native_size, sample, scheduler_config
from .photos import CLIP_PAN, CLIP_SCALE, CLIP_ZOOM, DEFAULT_CROP_SCALE, EXTRA_PACKAGES, HELD_OUT, TRAINING, load_photo
from .train import held_out_batch, structure_of

STRUCTURE_TIMESTEPS = (100, 500, 900)


def save_grid(images: torch.Tensor, path: Path, columns: int) -> None:
    """Images (N, 3, H, W) in rows of ``columns``; clips (N, 3, F, H, W) one per row as frame strips."""
    from PIL import Image

    if images.ndim == 5:
        images, columns = images.transpose(1, 2).flatten(0, 1), images.shape[2]
    pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    n, h, w, _ = pixels.shape
    rows = math.ceil(n / columns)
    grid = np.full((rows * (h + 2), columns * (w + 2), 3), 255, dtype=np.uint8)
    for i, image in enumerate(pixels):
        r, c = divmod(i, columns)
        grid[r * (h + 2) : r * (h + 2) + h, c * (w + 2) : c * (w + 2) + w] = image
    Image.fromarray(grid).save(path)


@torch.no_grad()
def layout_check(model: ReferenceModel, timestep: int = 900) -> dict:
    """Has the model learned its photographs' layouts? Each training photograph (centre crop of the whole
    shorter side) is noised to ``timestep`` and the clean image the model predicts under its own class is
    compared with it (PSNR, mean over photographs), against the photograph's flat mean colour: a model that
    knows only colours scores about the flat value; one that knows the scenes scores well above it. The video
    model gets a still clip of the photograph (every frame alike)."""
    from diffusers import DDPMScheduler

    photos = {p.name: p for p in TRAINING}
    labels = [i for i, name in enumerate(model.class_names) if name in photos]
    size = native_size(model.kind)
    x0 = []
    for i in labels:
        image = load_photo(photos[model.class_names[i]], size)
        _, h, w = image.shape
        top, left = (h - size) // 2, (w - size) // 2
        x0.append(image[:, top : top + size, left : left + size])
    x0 = torch.stack(x0)
    if model.is_video:
        x0 = x0[:, :, None].expand(-1, -1, VIDEO_FRAMES, -1, -1)
    alpha = DDPMScheduler(**scheduler_config()).alphas_cumprod[timestep]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    xt = alpha.sqrt() * x0 + (1 - alpha).sqrt() * noise
    predicted = ((xt - (1 - alpha).sqrt() * model(xt, torch.tensor(timestep), torch.tensor(labels))) / alpha.sqrt()).clamp(-1, 1)

    def psnr(a: torch.Tensor) -> float:  # images in [-1, 1]: peak-to-peak 2
        return float((10 * torch.log10(4 / ((a - x0) ** 2).flatten(1).mean(1))).mean())

    flat = x0.flatten(2).mean(-1).view(*x0.shape[:2], *[1] * (x0.ndim - 2)).expand_as(x0)
    return {"timestep": timestep, "psnr": psnr(predicted), "flat_psnr": psnr(flat)}


def measure(weights: Path, per_class: int = 2, steps: int = 20) -> dict:
    """Structure (trained and random twin), samples, the nearest-class and layout checks of the model in ``weights``."""
    from ..evaluate import nearest_class_accuracy

    model = load_reference(weights)
    torch.manual_seed(0)
    twin = ReferenceModel(model.kind, model.num_classes, model.class_names).eval()
    size, frames = native_size(model.kind), VIDEO_FRAMES if model.is_video else 0
    x0 = held_out_batch(size, frames=frames)
    structure = {"trained": structure_of(model, x0, STRUCTURE_TIMESTEPS), "random twin": structure_of(twin, x0, STRUCTURE_TIMESTEPS)}
    per_class = 1 if frames else per_class  # a clip is a row of frames
    labels = torch.arange(model.num_classes).repeat_interleave(per_class)
    noise = torch.randn(len(labels), 3, *([frames] if frames else []), size, size, generator=torch.Generator().manual_seed(0))
    images = torch.cat([sample(model, labels[i : i + 8], noise[i : i + 8], steps=steps) for i in range(0, len(labels), 8)])
    save_grid(images, weights.with_suffix(".png"), columns=2 * per_class * 2)
    firsts = images[:, :, 0] if frames else images  # the nearest-class check looks at a clip's first frame
    as_arrays = [((im.permute(1, 2, 0).numpy() + 1) / 2).astype(np.float64) for im in firsts]
    accuracy = nearest_class_accuracy(as_arrays, labels.tolist(), model.class_names)
    layout = layout_check(model)
    return {"structure": structure, "nearest_class_accuracy": accuracy, "layout": layout, "samples": len(labels), "sample_steps": steps}


def _machines(log: dict) -> str:
    """Where the run's invocations ran, as training.json recorded it (older logs did not)."""
    machines = sorted({run["machine"] for run in log.get("runs", [])})
    return "; ".join(machines) if machines else "machine not recorded"


def _run_count(log: dict) -> str:
    """How many invocations trained the run, as far as training.json recorded them."""
    runs = log.get("runs", [])
    if not runs:
        return "in one or more runs"
    restarts = "".join(
        f"; at step {run['from_step']} continued from the saved weights {run['from_weights']} with a fresh optimiser"
        for run in runs
        if "from_weights" in run
    )
    if "reconstructed" in log:  # a log rebuilt after its run folder was lost says what it lacks
        restarts += f" (log of {log['reconstructed']})"
    if runs[0]["from_step"] > 0:
        return f"in {len(runs)} recorded run(s) from step {runs[0]['from_step']} on, after unrecorded ones{restarts}"
    return f"in {len(runs)} run(s){restarts}"


def _phases(log: dict) -> list[dict]:
    """The run's training phases: resolution, crop scale, lr and EMA of each stretch of steps (a resumed
    invocation may change them; logs older than that record only the first configuration), each with its
    ``from_step`` and ``to_step``."""
    config = log["config"]
    first = {
        "res": config.get("res") or native_size(config["kind"]),
        "frames": config.get("frames") or (VIDEO_FRAMES if config["kind"] == "video" else 0),
        "crop_scale": config.get("crop_scale", list(DEFAULT_CROP_SCALE)),
        "lr": config["lr"],
        "ema": config["ema"],
    }
    runs = [{**first, **run} for run in log.get("runs", [])]
    if not runs or runs[0]["from_step"] > 0:  # invocations before runs were recorded used the first configuration
        runs.insert(0, {**first, "from_step": 0})
    phases: list[dict] = []
    for run in runs:
        if phases and all(phases[-1][k] == run[k] for k in first):
            continue
        phases.append(run)
    ends = [p["from_step"] for p in phases[1:]] + [log["step"]]
    return [{**p, "to_step": end} for p, end in zip(phases, ends)]


def _phase_text(phases: list[dict]) -> str:
    def data(p: dict) -> str:
        if p.get("frames"):
            return f"clips of {p['frames']} frames"
        return f"crops {p['crop_scale'][0]:g}-{p['crop_scale'][1]:g} of the shorter side"

    return "; ".join(f"steps {p['from_step']}-{p['to_step']}: {p['res']} px, {data(p)}, lr {p['lr']:g}, EMA {p['ema']:g}" for p in phases)


def _resolution_text(phases: list[dict], size: int = IMAGE_SIZE, frames: int = 0) -> str:
    """Whether the model is evaluated at the size (and clip length) it was trained at (the card must not
    claim it otherwise)."""
    shapes = sorted({(p["res"], p.get("frames", 0)) for p in phases})

    def name(shape: tuple[int, int]) -> str:
        return f"{shape[0]} px" + (f" x {shape[1]} frames" if shape[1] else "")

    native = (size, frames)
    if shapes == [native]:
        return "Evaluated at the size it is trained at."
    if (phases[-1]["res"], phases[-1].get("frames", 0)) == native:
        others = [s for s in shapes if s != native]
        cheaper = all(r <= size and f <= frames for r, f in others)
        return (
            f"Trained first at {', '.join(name(s) for s in others)}{' (cheaper steps)' if cheaper else ''}, last at "
            f"{name(native)}, the size it is evaluated at (see Phases)."
        )
    return f"Evaluated at {name(native)}, but its last training phase ran at {name((phases[-1]['res'], phases[-1].get('frames', 0)))} (see Phases)."


def write_card(weights: Path, log: dict, measured: dict) -> Path:
    """The model card beside ``weights`` from the run's log (training.json) and :func:`measure`'s results."""
    config = log["config"]
    kind = config["kind"]
    params = sum(p.numel() for p in ReferenceModel(kind, len(log["photos"])).parameters())
    licences = {p.name: p.licence for p in (*TRAINING, *HELD_OUT)}
    photos = "\n".join(f"| {name} | {licences.get(name, '')} |" for name in log["photos"])
    held_out = ", ".join(p.name for p in HELD_OUT)
    losses = log["losses"]
    stride = max(1, len(losses) // 24)
    loss_rows = "\n".join(
        f"| {s} | {loss:.4f} | {seconds / 3600:.2f} |"
        for s, loss, seconds in losses[::stride] + ([losses[-1]] if losses and (len(losses) - 1) % stride else [])
    )
    video = kind == "video"
    size, frames = native_size(kind), VIDEO_FRAMES if video else 0

    def in_time(r: dict) -> str:  # video: the temporal column
        return f" {r['time_ratio']:.2f} |" if video and "time_ratio" in r else (" |" if video else "")

    curve = "\n".join(f"| {r['step']} | {r['entropy']:.3f} | {r['distance_ratio']:.2f} |{in_time(r)}" for r in log["structure"])
    final = "\n".join(
        f"| {name} | {r['timestep']} | {r['entropy']:.3f} | {r['distance']:.1f} ({r['distance_ratio']:.2f}x) |"
        + (f" {r['time_distance']:.2f} ({r['time_ratio']:.2f}x) |" if video else "")
        for name, rows in measured["structure"].items()
        for r in rows
    )
    trained = measured["structure"]["trained"][0]
    uniform = trained["uniform_distance"]
    time_header = (" in time, frames (x uniform) |", "---|") if video else ("", "")
    curve_header = (" in time (x uniform) |", "---|") if video else ("", "")
    if video:
        shape = f"{frames} frames at {size}x{size}"
        uniform_text = (
            f"uniform attention on this grid: {uniform:.1f} tokens in space, {trained['uniform_time_distance']:.2f} frames in time"
        )
        data = (
            f"clips in which a camera pans (up to {CLIP_PAN:g} of the crop's side per frame) and zooms (up to {CLIP_ZOOM:g}x per "
            f"frame) over crops of {CLIP_SCALE[0]:g}-{CLIP_SCALE[1]:g} of the shorter side (horizontal flips) of"
        )
        samples = "one clip per photograph class (rows, in class order; frames left to right)"
    else:
        shape = f"{size}x{size}"
        uniform_text = f"uniform attention on this grid: {uniform:.1f} tokens"
        data = "random crops (side a fraction of the shorter side, as in the phases; horizontal flips) of"
        samples = f"{measured['samples'] // len(log['photos'])} samples per photograph class (rows of classes in order)"
    phases = _phases(log)
    text = f"""# tokenmerge reference model: {kind}

Generated by `tokenmerge train-reference` from the run's log; not edited by hand. A small diffusion model
trained here to judge token-merging quality (random weights cannot: their attention is nearly uniform, where
any reduction of keys looks lossless). Not a general image generator.

- Architecture: diffusers `{backbone_class(kind)}`,
  `tokenmerge.tools.reference.models.CONFIGS["{kind}"]` = `{json.dumps(CONFIGS[kind])}`; {params / 1e6:.2f} M parameters;
  3-channel pixel space, {"clips of " if video else ""}{shape}; condition = which photograph an image comes from, as learned tokens
  (+ a null class for classifier-free guidance). {_resolution_text(phases, size, frames)}
- Training: {log["step"]} steps, batch {config["batch"]}, AdamW (warm-up {config["warmup"]} steps), condition dropout
  {config["cond_dropout"]}, cosine noise schedule (1000 steps, epsilon prediction), seed {config["seed"]},
  {log["seconds"] / 3600:.1f} h of wall time, pauses included ({_machines(log)}), {_run_count(log)}
  (`tokenmerge train-reference --kind {kind} --out DIR --seed {config["seed"]}` resumes `DIR/checkpoint.pt`;
  `--init-from {weights.name}` continues from these weights and the log in their metadata).
- Phases: {_phase_text(phases)}.
- Data: {data} {len(log["photos"])} colour photographs that ship inside
  PyPI wheels (`pip install --no-deps {" ".join(EXTRA_PACKAGES)}` adds those not in scikit-image, scikit-learn and matplotlib):

| photograph (package:file) | licence |
|---|---|
{photos}

  Held out (never trained on; the structure measurement uses them): {held_out}.

## Attention structure

Highest-resolution self-attention (image queries over image keys; captured at the attention call), on noised
{"clips" if video else "crops"} of the held-out photographs at {shape}, null condition: normalised entropy (1 = uniform) and mean
attention distance ({uniform_text}).

| model | t | entropy | mean distance (x uniform) |{time_header[0]}
|---|---|---|---|{time_header[1]}
{final}

During training (EMA weights, t = 500):

| step | entropy | distance (x uniform) |{curve_header[0]}
|---|---|---|{curve_header[1]}
{curve}

## Samples

`{weights.with_suffix(".png").name}`: {samples}, {measured["sample_steps"]} DDIM steps, CFG 3.
Nearest-class check: {measured["nearest_class_accuracy"]:.0%} of the samples{" (first frames)" if video else ""} have their nearest training crop (L2 at 16x16 over
random crops of every training photograph) in the photograph they were conditioned on (chance: {1 / len(log["photos"]):.0%}).
Layout check: the clean image predicted from the training photographs noised to t = {measured["layout"]["timestep"]} (own class) is
{measured["layout"]["psnr"]:.1f} dB PSNR from them, against {measured["layout"]["flat_psnr"]:.1f} dB for their flat mean colour (a model that knows the scenes scores well above that; one that knows only their colours, about the same).

## Loss (mean MSE per {config["log_every"]} steps)

| step | loss | wall hours |
|---|---|---|
{loss_rows}
"""
    path = weights.with_suffix(".md")
    path.write_text(text)
    weights.with_suffix(".json").write_text(json.dumps(measured, indent=1))
    return path


def finish(run: Path, log=print, sample_steps: int = 20) -> Path:
    """Measure the trained model of the run folder ``run`` and write its card."""
    run = Path(run)
    data = json.loads((run / "training.json").read_text())
    weights = run / f"reference-{data['config']['kind']}.safetensors"
    measured = measure(weights, steps=sample_steps)
    path = write_card(weights, data, measured)
    log(f"wrote {path} (nearest-class accuracy {measured['nearest_class_accuracy']:.0%})")
    return path
