"""Train tokenmerge's reference model: a small SD-structured UNet on photographs shipped inside PyPI packages.

    python scripts/train_reference.py --minutes 55 --out src/tokenmerge/assets/reference.safetensors

Data: the colour photographs bundled with scikit-image, scikit-learn and matplotlib (no download), as random
crops (random scale, position and horizontal flip), resized to the training resolution. The condition is which
photograph a crop comes from. Everything is seeded; with the same package versions and thread count the run is
reproducible. Writes the weights (fp16 safetensors), a model card (MODEL_CARD.md), the loss curve (JSON) and a
sample grid (PNG) next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tokenmerge.reference import ReferenceModel, sample, save_reference, scheduler_config


def load_photographs(max_side: int = 256) -> tuple[list[torch.Tensor], list[str]]:
    """Colour photographs from installed packages as (3, H, W) tensors in [-1, 1], shorter side ``max_side``."""
    from PIL import Image

    found: list[tuple[str, np.ndarray]] = []
    import skimage.data

    for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "hubble_deep_field"):
        try:
            found.append((f"skimage:{name}", getattr(skimage.data, name)()))
        except Exception:  # a data file that this scikit-image version would download: skip it
            continue
    from sklearn.datasets import load_sample_images

    data = load_sample_images()
    for fname, image in zip(data.filenames, data.images):
        found.append((f"sklearn:{Path(fname).name}", image))
    import matplotlib.cbook

    for fname in ("grace_hopper.jpg",):
        with matplotlib.cbook.get_sample_data(fname) as f:
            found.append((f"matplotlib:{fname}", np.asarray(Image.open(f).convert("RGB"))))
    images, names = [], []
    for name, array in found:
        if array.ndim != 3 or array.shape[2] < 3:
            continue
        img = Image.fromarray(np.ascontiguousarray(array[..., :3]).astype(np.uint8))
        scale = max_side / min(img.size)
        img = img.resize((max(max_side, round(img.size[0] * scale)), max(max_side, round(img.size[1] * scale))), Image.BICUBIC)
        tensor = torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 127.5 - 1
        images.append(tensor)
        names.append(name)
    return images, names


def random_crops(images: list[torch.Tensor], batch: int, res: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` crops: random photograph, scale (1/4 to all of the shorter side), position and flip."""
    labels = torch.randint(len(images), (batch,), generator=g)
    crops = []
    for label in labels.tolist():
        img = images[label]
        _, h, w = img.shape
        side = int(min(h, w) * (0.25 + 0.75 * torch.rand(1, generator=g).item()))
        top = torch.randint(h - side + 1, (1,), generator=g).item()
        left = torch.randint(w - side + 1, (1,), generator=g).item()
        crop = F.interpolate(img[None, :, top : top + side, left : left + side], size=(res, res), mode="area")[0]
        if torch.rand(1, generator=g).item() < 0.5:
            crop = crop.flip(-1)
        crops.append(crop)
    return torch.stack(crops), labels


def save_grid(images: torch.Tensor, path: Path, columns: int) -> None:
    from PIL import Image

    images = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    n, h, w, _ = images.shape
    rows = math.ceil(n / columns)
    grid = np.full((rows * (h + 2), columns * (w + 2), 3), 255, dtype=np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, columns)
        grid[r * (h + 2) : r * (h + 2) + h, c * (w + 2) : c * (w + 2) + w] = img
    Image.fromarray(grid).save(path)


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    images, names = load_photographs()
    if args.max_images:
        images, names = images[: args.max_images], names[: args.max_images]
    print(f"{len(images)} photographs: {', '.join(names)}")
    model = ReferenceModel(len(images), names)
    params = sum(p.numel() for p in model.parameters())
    print(f"reference model: {params / 1e6:.2f} M parameters")
    ema = ReferenceModel(len(images), names)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    from diffusers import DDPMScheduler

    noise_scheduler = DDPMScheduler(**scheduler_config())
    alphas = noise_scheduler.alphas_cumprod
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    deadline = time.monotonic() + args.minutes * 60
    losses: list[tuple[int, float]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    running, step, started = 0.0, 0, time.monotonic()
    next_checkpoint = started + args.checkpoint_minutes * 60
    while step < args.steps and time.monotonic() < deadline:
        x0, labels = random_crops(images, args.batch, args.res, g)
        labels = torch.where(torch.rand(args.batch, generator=g) < args.cond_dropout, model.null_class, labels)
        t = torch.randint(0, noise_scheduler.config.num_train_timesteps, (args.batch,), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        a = alphas[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        lr = args.lr * min(1.0, (step + 1) / 200)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.mse_loss(model(xt, t, labels), noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            decay = min(args.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        step += 1
        running += loss.item()
        if step % args.log_every == 0:
            losses.append((step, running / args.log_every))
            print(f"step {step}  loss {running / args.log_every:.4f}  {time.monotonic() - started:.0f} s", flush=True)
            running = 0.0
        if time.monotonic() > next_checkpoint:  # intermediate weights, to inspect a long run
            save_reference(ema, out.with_suffix(".partial.safetensors"), {"steps": step, "train_res": args.res, "seed": args.seed})
            next_checkpoint += args.checkpoint_minutes * 60
    elapsed = time.monotonic() - started
    save_reference(ema, out, {"steps": step, "train_res": args.res, "seed": args.seed})
    (out.parent / "loss_curve.json").write_text(json.dumps({"step_loss": losses}, indent=1))
    ema.eval()
    labels = torch.arange(min(len(images), 8)).repeat_interleave(2)
    noise = torch.randn(len(labels), 3, args.sample_res, args.sample_res, generator=torch.Generator().manual_seed(0))
    samples = sample(ema, labels, noise, steps=25) if args.samples else None
    if samples is not None:
        save_grid(samples, out.parent / "samples.png", columns=8)
    write_card(out.parent / "MODEL_CARD.md", names, step, elapsed, params, args, losses)
    print(f"saved {out} after {step} steps in {elapsed / 60:.1f} min")


def write_card(path: Path, names: list[str], steps: int, seconds: float, params: int, args: argparse.Namespace, losses) -> None:
    curve = "\n".join(f"| {s} | {l:.4f} |" for s, l in losses[:: max(1, len(losses) // 20)])
    path.write_text(
        f"""# tokenmerge reference model

A small diffusers `UNet2DConditionModel` with Stable Diffusion's block structure, trained by
`scripts/train_reference.py` to judge token-merging quality (random weights cannot: their attention is
nearly uniform). Not a general image generator.

- Architecture: see `tokenmerge.reference.UNET_CONFIG`; {params / 1e6:.2f} M parameters; 3-channel pixel space;
  condition = which photograph a crop comes from, as {4} learned cross-attention tokens (+ a null class for CFG).
- Data: {len(names)} colour photographs bundled with PyPI packages: {', '.join(names)}. Random crops of 1/4 to all
  of the shorter side, horizontal flips, resized to {args.res}x{args.res}.
- Training: {steps} steps, batch {args.batch}, AdamW lr {args.lr}, condition dropout {args.cond_dropout}, EMA {args.ema},
  cosine noise schedule (1000 steps, epsilon prediction), seed {args.seed}, {seconds / 60:.1f} min on
  {torch.get_num_threads()} CPU threads (torch {torch.__version__}).
- Evaluation resolution: 64x64 (a top attention level of 4096 tokens); `samples.png` shows 25-step DDIM samples with
  CFG 3 at {args.sample_res}x{args.sample_res}, two per photograph class.

## Loss curve (mean MSE per {args.log_every} steps)

| step | loss |
|---|---|
{curve}
"""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="src/tokenmerge/assets/reference.safetensors")
    parser.add_argument("--minutes", type=float, default=55.0, help="stop after this much wall time")
    parser.add_argument("--steps", type=int, default=10**9, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--res", type=int, default=32, help="training resolution")
    parser.add_argument("--sample-res", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ema", type=float, default=0.995)
    parser.add_argument("--cond-dropout", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0, help="write <out>.partial.safetensors this often")
    parser.add_argument("--max-images", type=int, default=0, help="use only the first N photographs (smoke tests)")
    parser.add_argument("--no-samples", dest="samples", action="store_false", help="skip the sample grid")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
