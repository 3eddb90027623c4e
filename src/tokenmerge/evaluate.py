"""``tokenmerge eval``: paired image quality of token-merging configurations against vanilla sampling.

Every configuration samples the same seeds, conditions and initial noise as vanilla (DDIM, CFG); the
final images are compared pairwise with PSNR, SSIM (scikit-image) and relative L2, and reported as mean
and standard deviation over seeds, with the wall time and speed-up measured in the same run.

Models: the shipped reference model (``tokenmerge.reference``, default: a small trained UNet, the only
honest yardstick on machines without downloadable SD weights), a reference-format ``.safetensors``
file, or a user's diffusers pipeline folder (then the conditions are text prompts).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .variants import PatchSpec, available

PROMPTS = ("a photograph of a cat", "a mountain lake at dawn", "a bowl of fruit on a table", "a red car in the city")


def default_configs() -> list[PatchSpec]:
    """A few minutes on 2 CPU cores: the three ratios, tomesd at 0.5 (when installed), token downsampling and auto."""
    return available([PatchSpec.parse(s) for s in ("tome:0.25", "tome:0.5", "tome:0.75", "tomesd:0.5", "todo:2", "auto")])


@dataclass
class Result:
    name: str
    psnr: list[float] = field(default_factory=list)
    ssim: list[float] = field(default_factory=list)
    rel_l2: list[float] = field(default_factory=list)
    seconds: float = 0.0
    speedup: float = 1.0

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> tuple[float, float]:
            return (statistics.fmean(values), statistics.pstdev(values)) if values else (float("nan"), float("nan"))

        return {
            "config": self.name,
            "psnr_mean": stats(self.psnr)[0],
            "psnr_std": stats(self.psnr)[1],
            "ssim_mean": stats(self.ssim)[0],
            "ssim_std": stats(self.ssim)[1],
            "rel_l2_mean": stats(self.rel_l2)[0],
            "rel_l2_std": stats(self.rel_l2)[1],
            "seconds": self.seconds,
            "speedup": self.speedup,
        }


def compare(image: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    """PSNR (dB), SSIM and relative L2 of two HxWx3 float images in [0, 1]."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    psnr = peak_signal_noise_ratio(reference, image, data_range=1.0)
    ssim = structural_similarity(reference, image, data_range=1.0, channel_axis=-1)
    rel = float(np.linalg.norm(image - reference) / max(np.linalg.norm(reference), 1e-12))
    return float(psnr), float(ssim), rel


class ReferenceSampler:
    """Samples the reference model: condition = photograph class (seed modulo the number of classes)."""

    def __init__(self, path: str | Path | None, size: int, steps: int, guidance: float) -> None:
        from .reference import load_reference

        self.model = load_reference(path)
        self.size, self.steps, self.guidance = size, steps, guidance
        self.target = self.model.unet

    def describe(self) -> str:
        return f"reference model ({self.model.num_classes} photograph classes), {self.size}x{self.size} px"

    def __call__(self, seed: int) -> np.ndarray:
        from .reference import sample

        labels = torch.tensor([seed % self.model.num_classes])
        noise = torch.randn(1, 3, self.size, self.size, generator=torch.Generator().manual_seed(seed))
        image = sample(self.model, labels, noise, steps=self.steps, guidance=self.guidance)
        return ((image[0].permute(1, 2, 0).numpy() + 1) / 2).astype(np.float64)


class PipelineSampler:
    """Samples a user's diffusers pipeline folder with text prompts and a DDIM scheduler."""

    def __init__(self, path: str | Path, size: int, steps: int, guidance: float) -> None:
        from diffusers import DDIMScheduler, DiffusionPipeline

        self.pipe = DiffusionPipeline.from_pretrained(str(path))
        self.pipe.scheduler = DDIMScheduler.from_config(self.pipe.scheduler.config)
        self.pipe.set_progress_bar_config(disable=True)
        self.size, self.steps, self.guidance = size, steps, guidance
        self.target = self.pipe

    def describe(self) -> str:
        return f"{type(self.pipe).__name__}, {self.size}x{self.size} px"

    def __call__(self, seed: int) -> np.ndarray:
        out = self.pipe(
            PROMPTS[seed % len(PROMPTS)],
            height=self.size,
            width=self.size,
            num_inference_steps=self.steps,
            guidance_scale=self.guidance,
            generator=torch.Generator().manual_seed(seed),
            output_type="np",
        )
        return out.images[0].astype(np.float64)


def make_sampler(model: str | None, size: int, steps: int, guidance: float):
    if model is None or str(model).endswith(".safetensors"):
        return ReferenceSampler(model, size, steps, guidance)
    if Path(model).is_dir():
        return PipelineSampler(model, size, steps, guidance)
    raise FileNotFoundError(
        f"--model must be a diffusers pipeline folder or a reference .safetensors file, got {model!r}"
    )


def run_eval(
    configs: list[PatchSpec],
    seeds: list[int],
    sampler: Callable[[int], np.ndarray],
    target: Any,
    progress: Callable[[], None] = lambda: None,
) -> tuple[list[Result], dict[str, list[np.ndarray]]]:
    """Interleaved per seed: vanilla, then each configuration, from the same seed and noise."""
    results = {"vanilla": Result("vanilla")} | {c.name: Result(c.name) for c in configs}
    images: dict[str, list[np.ndarray]] = {name: [] for name in results}
    for seed in seeds:
        t0 = time.perf_counter()
        reference = sampler(seed)
        results["vanilla"].seconds += time.perf_counter() - t0
        images["vanilla"].append(reference)
        progress()
        for config in configs:
            config.patch(target)
            try:
                t0 = time.perf_counter()
                image = sampler(seed)
                results[config.name].seconds += time.perf_counter() - t0
            finally:
                config.unpatch(target)
            images[config.name].append(image)
            psnr, ssim, rel = compare(image, reference)
            result = results[config.name]
            result.psnr.append(psnr)
            result.ssim.append(ssim)
            result.rel_l2.append(rel)
            progress()
    base = results["vanilla"].seconds
    for result in results.values():
        result.speedup = base / result.seconds if result.seconds else float("nan")
    return list(results.values()), images


def format_results(results: list[Result], header: str) -> str:
    lines = [header, "| configuration | PSNR (dB) | SSIM | rel. L2 | seconds | speed-up |", "|---|---|---|---|---|---|"]
    for r in results:
        s = r.summary()
        if r.name == "vanilla":
            lines.append(f"| vanilla | (reference) | (reference) | 0 | {s['seconds']:.1f} | 1.00x |")
            continue
        lines.append(
            f"| {r.name} | {s['psnr_mean']:.2f} ± {s['psnr_std']:.2f} | {s['ssim_mean']:.4f} ± {s['ssim_std']:.4f} | "
            f"{s['rel_l2_mean']:.4f} ± {s['rel_l2_std']:.4f} | {s['seconds']:.1f} | {s['speedup']:.2f}x |"
        )
    return "\n".join(lines)


def results_json(results: list[Result], **meta: Any) -> str:
    return json.dumps({"meta": meta, "results": [r.summary() for r in results]}, indent=2)


def save_grid(images: dict[str, list[np.ndarray]], path: str | Path, rows: int = 4) -> None:
    """Rows = seeds, columns = vanilla and each configuration, with the configuration names on top."""
    from PIL import Image, ImageDraw

    names = list(images)
    rows = min(rows, len(images[names[0]]))
    h, w, _ = images[names[0]][0].shape
    label_h, pad = 14, 2
    canvas = Image.new("RGB", (len(names) * (w + pad), label_h + rows * (h + pad)), "white")
    draw = ImageDraw.Draw(canvas)
    for col, name in enumerate(names):
        draw.text((col * (w + pad) + 2, 1), name.replace("tokenmerge ", "tm ").replace("tomesd 0.1.3 ", "tomesd "), fill="black")
        for row in range(rows):
            tile = Image.fromarray((np.clip(images[name][row], 0, 1) * 255).round().astype(np.uint8))
            canvas.paste(tile, (col * (w + pad), label_h + row * (h + pad)))
    canvas.save(path)


def entropy_of_top_attention(unet: torch.nn.Module, run: Callable[[], Any]) -> float:
    """Mean normalised entropy of the self-attention rows of the highest-resolution blocks during ``run``.

    1.0 is uniform attention (what random weights give); a trained model attends selectively."""
    from .adapters import find_denoisers

    layout = find_denoisers(unet)[0]
    blocks = [b for c in layout.containers if c.level == layout.top_level for b in c.blocks]
    entropies: list[float] = []

    def record(attn: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        x = args[0]
        b, n, _ = x.shape
        heads = attn.heads
        q = attn.to_q(x).view(b, n, heads, -1).transpose(1, 2)
        k = attn.to_k(x).view(b, n, heads, -1).transpose(1, 2)
        p = (q @ k.transpose(-1, -2) * attn.scale).softmax(-1)
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1) / np.log(n)
        entropies.append(entropy.mean().item())

    handles = [b.attn1.register_forward_hook(record, with_kwargs=True) for b in blocks]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return statistics.fmean(entropies)
