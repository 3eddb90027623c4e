"""``tokenmerge eval``: paired image quality of token-merging configurations against vanilla sampling.

Every configuration samples the same seeds, conditions and initial noise as vanilla (DDIM, CFG); the
final images are compared pairwise with PSNR, SSIM (scikit-image) and relative L2, and reported as mean
and standard deviation over seeds, with the wall time and speed-up measured in the same run. Clips (the
video reference model) are compared as a whole (PSNR over every frame's pixels, SSIM averaged over frames)
and frame by frame, so that an error that grows along the clip or flickers shows. ``--baseline`` adds the
paired per-seed difference of every configuration against one of them ("better on n of N seeds").

Models: a shipped reference model (:mod:`tokenmerge.tools.reference`: a small trained UNet by default, an
SD3-style or Flux-style transformer, a Wan-style video transformer; the only honest yardstick on machines
without downloadable weights), a reference-format ``.safetensors`` file, or a user's diffusers pipeline
folder (then the conditions are text prompts).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .caches import Clock
from .specs import PatchSpec, available
from .work import count

PROMPTS = ("a photograph of a cat", "a mountain lake at dawn", "a bowl of fruit on a table", "a red car in the city")


# The video yardstick's comparison (a (4, 16, 16) token grid): ToMe at one ratio with spatial (st=1), joint (st=2)
# and temporal-only (1x1 spatial) windows; key/value reduction at equal key counts, 1/2, 1/4 and 1/8 of the keys,
# spatial, temporal and joint; and auto at the strength it uses on Wan at 480p x 81 frames (2x2x2: the yardstick's
# 256-token frames are below auto_min_tokens, so its budget is scaled to them).
VIDEO_CONFIGS = (
    "tome:0.5",
    "tome:0.5,st=2",
    "tome:0.5,st=2,sx=1,sy=1",
    "todo:2x1x1",
    "todo:1x2x1",
    "todo:1x2x2",
    "todo:4x1x1",
    "todo:2x2x1",
    "todo:2x2x2",
    "todo:1x4x2",
    "todo:4x2x1",
    "auto,auto_max_keys=64,auto_min_tokens=128",
)


def default_configs(kind: str | None = None) -> list[PatchSpec]:
    """A few minutes on 2 CPU cores: the three ratios, tomesd at 0.5 (when installed), token downsampling and auto;
    on the video model, :data:`VIDEO_CONFIGS`."""
    names = VIDEO_CONFIGS if kind == "video" else ("tome:0.25", "tome:0.5", "tome:0.75", "tomesd:0.5", "todo:2", "auto")
    return available([PatchSpec.parse(s) for s in names])


@dataclass
class Result:
    name: str
    psnr: list[float] = field(default_factory=list)
    ssim: list[float] = field(default_factory=list)
    rel_l2: list[float] = field(default_factory=list)
    psnr_frames: list[list[float]] = field(default_factory=list)  # clips: per seed, PSNR of each frame
    seconds: float = 0.0
    speedup: float = 1.0
    macs: int = 0  # multiply-adds of one generation (the first seed's, counted apart from the timed runs)
    less_work: float = 1.0  # vanilla's multiply-adds / this configuration's

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> tuple[float, float]:
            if not values:
                return float("nan"), float("nan")
            if not all(np.isfinite(values)):  # an image identical to vanilla's: inf dB (a cache that never fired)
                return float(np.mean(values)), float("nan")
            return statistics.fmean(values), statistics.pstdev(values)

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
            "gmacs": self.macs / 1e9,
            "less_work": self.less_work,
            "psnr_per_seed": list(self.psnr),  # in seed order, the same seeds for every configuration: paired differences
        } | ({"psnr_per_frame": self.frame_means()} if self.psnr_frames else {})

    def frame_means(self) -> list[float]:
        """Mean PSNR over seeds of each frame of a clip."""
        return [statistics.fmean(values) for values in zip(*self.psnr_frames)]


def compare(image: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    """PSNR (dB), SSIM and relative L2 of two HxWx3 float images in [0, 1]; of two FxHxWx3 clips, PSNR over
    all their pixels and SSIM averaged over frames."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    psnr = peak_signal_noise_ratio(reference, image, data_range=1.0)
    frames = zip(reference, image) if image.ndim == 4 else [(reference, image)]
    ssim = statistics.fmean(structural_similarity(r, i, data_range=1.0, channel_axis=-1) for r, i in frames)
    rel = float(np.linalg.norm(image - reference) / max(np.linalg.norm(reference), 1e-12))
    return float(psnr), float(ssim), rel


def frame_psnr(clip: np.ndarray, reference: np.ndarray) -> list[float]:
    """PSNR (dB) of each frame of two FxHxWx3 clips in [0, 1]."""
    from skimage.metrics import peak_signal_noise_ratio

    with np.errstate(divide="ignore"):  # an identical frame: inf dB
        return [float(peak_signal_noise_ratio(r, c, data_range=1.0)) for r, c in zip(reference, clip)]


class ReferenceSampler:
    """Samples a reference model: condition = photograph class (seed modulo the number of classes). The video
    model samples clips of ``frames`` frames (default: the frames it is trained on)."""

    def __init__(self, path: str | Path, size: int | None, steps: int | None, guidance: float | None, frames: int | None = None) -> None:
        from .reference.models import VIDEO_FRAMES, load_reference, native_size, sampler_timesteps

        self.path = Path(path)
        self.model = load_reference(path)
        distilled = self.model.sampling
        if distilled and guidance is not None:
            raise ValueError(f"--guidance: {self.path.name} is guidance-distilled (sampled without classifier-free guidance)")
        steps = steps or (distilled["steps"] if distilled else 20)
        self.size, self.steps, self.guidance = size or native_size(self.model.kind), steps, guidance
        self.frames = (frames or VIDEO_FRAMES) if self.model.is_video else 0
        if frames and not self.model.is_video:
            raise ValueError(f"--frames applies to the video reference model only; {self.path.name} is a {self.model.kind} model")
        self.target = self.model.denoiser
        self.clock = Clock(
            steps, timesteps=sampler_timesteps(self.model, steps)
        )  # the step caches (+fbcache, ...) read the loop's step from it

    def describe(self) -> str:
        clip = f", {self.frames} frames" if self.frames else ""
        loop = (
            f"{self.steps} distilled steps, no CFG"
            if self.model.sampling
            else f"{self.steps} DDIM steps, CFG {3.0 if self.guidance is None else self.guidance:g}"
        )
        return (
            f"reference model {self.path.name} ({self.model.kind}, {self.model.num_classes} photograph classes), "
            f"{self.size}x{self.size} px{clip}, {loop}"
        )

    def label(self, seed: int) -> int:
        return seed % self.model.num_classes

    def __call__(self, seed: int) -> np.ndarray:
        from .reference.models import sample

        labels = torch.tensor([self.label(seed)])
        clip = (self.frames,) if self.frames else ()
        noise = torch.randn(1, 3, *clip, self.size, self.size, generator=torch.Generator().manual_seed(seed))
        image = sample(self.model, labels, noise, steps=self.steps, guidance=self.guidance, clock=self.clock)[0]
        channels_last = image.movedim(0, -1)  # (H, W, 3), or (F, H, W, 3) for a clip
        return ((channels_last.numpy() + 1) / 2).astype(np.float64)


class PipelineSampler:
    """Samples a user's diffusers pipeline folder with text prompts (UNet pipelines with DDIM; transformer
    pipelines with their own flow-matching scheduler)."""

    def __init__(self, path: str | Path, size: int | None, steps: int | None, guidance: float | None) -> None:
        from diffusers import DDIMScheduler, DiffusionPipeline

        self.pipe = DiffusionPipeline.from_pretrained(str(path))
        if "unet" in self.pipe.components:
            self.pipe.scheduler = DDIMScheduler.from_config(self.pipe.scheduler.config)
        self.pipe.set_progress_bar_config(disable=True)
        self.size, self.steps, self.guidance = size or 512, steps or 20, 3.0 if guidance is None else guidance
        self.target = self.pipe

    def describe(self) -> str:
        return f"{type(self.pipe).__name__}, {self.size}x{self.size} px, {self.steps} steps, CFG {self.guidance:g}"

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


def make_sampler(
    model: str | None, size: int | None, steps: int | None, guidance: float | None, frames: int | None = None
) -> ReferenceSampler | PipelineSampler:
    """``model``: None (the default shipped reference model, ``DEFAULT_KIND``), a shipped one (``unet``, ``sd3``,
    ``flux``, ``video``, ``flux-distilled``), a reference ``.safetensors`` file, or a diffusers pipeline folder.
    ``size`` None: the reference model's own size (64 px; the video model's 32 px), 512 px for a pipeline; ``steps``
    and ``guidance`` None: the model's own (20 DDIM steps with CFG 3; a distilled model's steps without CFG)."""
    from .reference.models import DEFAULT_KIND, SHIPPED, shipped

    if model is None or model in SHIPPED:
        return ReferenceSampler(shipped(model or DEFAULT_KIND), size, steps, guidance, frames)
    if str(model).endswith(".safetensors"):
        return ReferenceSampler(model, size, steps, guidance, frames)
    if frames:
        raise ValueError("--frames applies to the video reference model only, not to a pipeline folder")
    if Path(model).is_dir():
        return PipelineSampler(model, size, steps, guidance)
    raise FileNotFoundError(
        f"--model must be one of {', '.join(SHIPPED)} (a shipped reference model), a reference .safetensors file or a "
        f"diffusers pipeline folder; got {model!r}"
    )


def run_eval(
    configs: list[PatchSpec],
    seeds: list[int],
    sampler: Callable[[int], np.ndarray],
    target: Any,
    progress: Callable[[], None] = lambda: None,
) -> tuple[list[Result], dict[str, list[np.ndarray]]]:
    """Per seed, vanilla and every configuration from the same seed and noise, in an order rotated from seed
    to seed (so that no configuration always runs first); each image is then compared with vanilla's. Each
    configuration's work (multiply-adds, :mod:`tokenmerge.tools.work`) is counted on one more, untimed generation of
    the first seed."""
    runs: list[PatchSpec | None] = [None, *configs]
    results = {"vanilla": Result("vanilla")} | {c.name: Result(c.name) for c in configs}
    images: dict[str, list[np.ndarray]] = {name: [] for name in results}
    for round_index, seed in enumerate(seeds):
        shift = round_index % len(runs)
        produced: dict[str, np.ndarray] = {}
        for config in runs[shift:] + runs[:shift]:
            name = "vanilla" if config is None else config.name
            with contextlib.nullcontext() if config is None else config.applied(target, clock=getattr(sampler, "clock", None)):
                t0 = time.perf_counter()
                produced[name] = sampler(seed)
                results[name].seconds += time.perf_counter() - t0
            progress()
        reference = produced["vanilla"]
        for name, image in produced.items():
            images[name].append(image)
            if name != "vanilla":
                psnr, ssim, rel = compare(image, reference)
                results[name].psnr.append(psnr)
                results[name].ssim.append(ssim)
                results[name].rel_l2.append(rel)
                if image.ndim == 4:
                    results[name].psnr_frames.append(frame_psnr(image, reference))
    for config in runs:
        with contextlib.nullcontext() if config is None else config.applied(target, clock=getattr(sampler, "clock", None)):
            results["vanilla" if config is None else config.name].macs = count(lambda: sampler(seeds[0])).total
        progress()
    base, work = results["vanilla"].seconds, results["vanilla"].macs
    for result in results.values():
        result.speedup = base / result.seconds if result.seconds else float("nan")
        result.less_work = work / result.macs if result.macs else float("nan")
    return list(results.values()), images


def format_results(results: list[Result], header: str) -> str:
    lines = [
        header,
        "| configuration | PSNR (dB) | SSIM | rel. L2 | seconds | speed-up | work (×less) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.summary()
        if r.name == "vanilla":
            lines.append(f"| vanilla | (reference) | (reference) | 0 | {s['seconds']:.1f} | 1.00x | {s['gmacs']:.2f} GMACs |")
            continue
        lines.append(
            f"| {r.name} | {s['psnr_mean']:.2f} ± {s['psnr_std']:.2f} | {s['ssim_mean']:.4f} ± {s['ssim_std']:.4f} | "
            f"{s['rel_l2_mean']:.4f} ± {s['rel_l2_std']:.4f} | {s['seconds']:.1f} | {s['speedup']:.2f}x | {s['less_work']:.2f}x |"
        )
    clips = [r for r in results if r.psnr_frames]
    if clips:
        frames = len(clips[0].psnr_frames[0])
        lines += [
            "",
            "PSNR (dB) per frame, mean over seeds:",
            "| configuration | " + " | ".join(f"frame {i}" for i in range(frames)) + " |",
        ]
        lines.append("|---|" + "---|" * frames)
        lines += [f"| {r.name} | " + " | ".join(f"{v:.2f}" for v in r.frame_means()) + " |" for r in clips]
    return "\n".join(lines)


def paired_against(results: list[Result], baseline: str) -> list[dict[str, Any]]:
    """Per configuration, its paired per-seed PSNR difference against the configuration named ``baseline``
    (same seeds, same noise): how many seeds it is at least as good on, and the mean and spread of the gap."""
    by_name = {r.name: r for r in results}
    if baseline not in by_name or baseline == "vanilla":
        raise ValueError(
            f"--baseline must be one of the configurations compared ({', '.join(r.name for r in results[1:])}), got {baseline!r}"
        )
    base = by_name[baseline].psnr
    rows = []
    for r in results:
        if r.name in ("vanilla", baseline):
            continue
        finite = [(a, b) for a, b in zip(r.psnr, base) if np.isfinite(a) and np.isfinite(b)]
        gaps = [a - b for a, b in finite]
        rows.append(
            {
                "config": r.name,
                "baseline": baseline,
                "at_least_as_good": sum(a >= b for a, b in zip(r.psnr, base)),
                "seeds": len(base),
                "psnr_gap_mean": statistics.fmean(gaps) if gaps else float("nan"),
                "psnr_gap_std": statistics.pstdev(gaps) if gaps else float("nan"),
                "psnr_gap_per_seed": [a - b for a, b in zip(r.psnr, base)],
                "identical_to_vanilla": not any(np.isfinite(a) for a in r.psnr),
            }
        )
    return rows


def format_paired(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = [
        f"paired against {rows[0]['baseline']} (PSNR vs vanilla, per seed):",
        "| configuration | PSNR >= baseline's | PSNR gap (dB) |",
        "|---|---|---|",
    ]
    lines += [f"| {r['config']} | {r['at_least_as_good']}/{r['seeds']} seeds | {_gap(r)} |" for r in rows]
    return "\n".join(lines)


def _gap(row: dict[str, Any]) -> str:
    """A paired row's PSNR gap: mean ± spread over the seeds where both PSNRs are finite; where none is, the
    configuration's images are vanilla's (infinite PSNR: it changed nothing), said as such."""
    if np.isfinite(row["psnr_gap_mean"]):
        return f"{row['psnr_gap_mean']:+.2f} ± {row['psnr_gap_std']:.2f}"
    return "identical to vanilla" if row["identical_to_vanilla"] else "the baseline is identical to vanilla"


def results_json(results: list[Result], **meta: Any) -> str:
    return json.dumps({"meta": meta, "results": [r.summary() for r in results]}, indent=2)


def group_of(name: str) -> str:
    """The line of a frontier plot a configuration (by its result's name) belongs to: what it varies."""
    if " + " in name:
        return "with a step cache" if not name.startswith("tokenmerge") else f"tokenmerge + {name.split(' + ')[-1]}"
    if name.startswith("tokenmerge r="):
        return "tokenmerge tome (ratio)"
    if name.startswith("tokenmerge todo"):
        return "tokenmerge todo (kv_factor)"
    if name.startswith("tokenmerge auto") and "max_noise=" in name:  # one line per budget, along max_noise
        return " ".join(w for w in name.split() if not w.startswith("max_noise=")) + " (max_noise)"
    if name.startswith("tokenmerge auto"):
        return "tokenmerge auto (budget)"
    if name.startswith("tokenmerge tokencache"):
        return "tokenmerge tokencache (settings)"
    if name.startswith("tomesd"):
        return "tomesd (ratio)"
    return "step caches alone"


def frontier_groups(results: list[Result]) -> dict[str, list[Result]]:
    """The configurations of a frontier plot by what they vary (:func:`group_of`: ToMe ratios, token-downsampling
    factors, auto budgets, token-cache settings, step caches alone and stacked), each a line ordered by speed-up."""
    groups: dict[str, list[Result]] = {}
    for result in results:
        if result.name != "vanilla":
            groups.setdefault(group_of(result.name), []).append(result)
    return {g: sorted(rs, key=lambda r: r.speedup) for g, rs in groups.items()}


def save_work_frontier(files: list[dict[str, Any]], path: str | Path, highlight: tuple[str, ...] = ()) -> None:
    """PSNR against vanilla (mean over seeds, bars: one standard deviation) against the work saved (vanilla's
    multiply-adds / the configuration's: machine-independent, unlike a small model's seconds), from the JSON files
    of ``tokenmerge eval --json`` (``files``: their contents): one panel per model and seed set, the configurations of
    its files pooled (the first file's row where two have one), one line per group of :func:`group_of`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, dict[str, dict[str, Any]]] = {}
    for data in files:
        meta = data["meta"]
        seeds = f"seeds {meta['first_seed']}-{meta['first_seed'] + meta['seeds'] - 1}"
        rows = panels.setdefault(f"{meta['model']}, {meta['steps']} steps, {seeds}", {})
        for row in data["results"]:
            if row["config"] != "vanilla":
                rows.setdefault(row["config"], row)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows.values():
            groups.setdefault(group_of(row["config"]), []).append(row)
        for group, members in groups.items():
            members.sort(key=lambda r: r["less_work"])
            x = [r["less_work"] for r in members]
            y = [r["psnr_mean"] for r in members]
            ax.errorbar(
                x,
                y,
                yerr=[r["psnr_std"] for r in members],
                marker="o",
                capsize=3,
                label=group,
                linestyle="-" if len(members) > 1 else "none",
            )
            for r, xv, yv in zip(members, x, y):
                if r["config"] in highlight:
                    short = r["config"].replace("tokenmerge ", "").replace("refresh_every=", "/").replace("full_steps=", "/")
                    ax.annotate(short, (xv, yv), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("work saved: x less multiply-adds than vanilla")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("PSNR against vanilla (dB)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_frontier(results: list[Result], path: str | Path, title: str, highlight: tuple[str, ...] = ()) -> None:
    """PSNR and SSIM (mean over seeds, bars: one standard deviation) against the speed-up measured in the same run,
    one line per group of :func:`frontier_groups`; ``highlight`` names configurations labelled on the plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for group, members in frontier_groups(results).items():
        x = [r.speedup for r in members]
        for ax, metric in zip(axes, ("psnr", "ssim")):
            values = [getattr(r, metric) for r in members]
            finite = [[v for v in vs if np.isfinite(v)] for vs in values]
            means = [statistics.fmean(v) if v else float("nan") for v in finite]
            stds = [statistics.pstdev(v) if len(v) > 1 else 0.0 for v in finite]
            ax.errorbar(x, means, yerr=stds, marker="o", capsize=3, label=group, linestyle="-" if len(members) > 1 else "none")
            for r, m in zip(members, means):
                if r.name in highlight:
                    ax.annotate(r.name.replace("tokenmerge ", ""), (r.speedup, m), fontsize=7, xytext=(4, 4), textcoords="offset points")
    axes[0].set_ylabel("PSNR against vanilla (dB)")
    axes[1].set_ylabel("SSIM against vanilla")
    for ax in axes:
        ax.set_xlabel("speed-up over vanilla (same run)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_grid(images: dict[str, list[np.ndarray]], path: str | Path, rows: int = 4) -> None:
    """Rows = seeds, columns = vanilla and each configuration, with the configuration names on top. Clips:
    :func:`save_strips`."""
    from PIL import Image, ImageDraw

    names = list(images)
    if images[names[0]][0].ndim == 4:
        save_strips(images, path)
        return
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


def save_strips(clips: dict[str, list[np.ndarray]], path: str | Path, seeds: int = 2) -> None:
    """Clips as frame strips: per seed, one row per configuration (vanilla first), frames left to right, the
    configuration named at the left."""
    from PIL import Image, ImageDraw

    names = list(clips)
    seeds = min(seeds, len(clips[names[0]]))
    frames, h, w, _ = clips[names[0]][0].shape
    label_w, pad, gap = 110, 2, 8
    height = seeds * (len(names) * (h + pad) + gap)
    canvas = Image.new("RGB", (label_w + frames * (w + pad), height), "white")
    draw = ImageDraw.Draw(canvas)
    for seed in range(seeds):
        for row, name in enumerate(names):
            top = seed * (len(names) * (h + pad) + gap) + row * (h + pad)
            draw.text((2, top + h // 3), f"{seed}: " + name.replace("tokenmerge ", "tm "), fill="black")
            for frame in range(frames):
                tile = Image.fromarray((np.clip(clips[name][seed][frame], 0, 1) * 255).round().astype(np.uint8))
                canvas.paste(tile, (label_w + frame * (w + pad), top))
    canvas.save(path)


def structure_table(sampler: ReferenceSampler, timesteps: tuple[int, ...] = (100, 500, 900)) -> str:
    """Attention structure of the reference model and of its randomly initialised twin, on noised crops of
    held-out photographs at the evaluation size (see :mod:`tokenmerge.tools.reference.structure`)."""
    from .reference.models import ReferenceModel
    from .reference.train import held_out_batch, structure_of

    model = sampler.model
    torch.manual_seed(0)
    twin = ReferenceModel(model.kind, model.num_classes, model.class_names).eval()
    x0 = held_out_batch(sampler.size, frames=sampler.frames)
    clip = f" x {sampler.frames} frames" if sampler.frames else ""
    lines = [
        f"highest-resolution self-attention on noised held-out photographs, {sampler.size}x{sampler.size} px{clip}:",
        "| model | t | normalised entropy | mean attention distance (x uniform) |" + (" in time, frames (x uniform) |" if clip else ""),
        "|---|---|---|---|" + ("---|" if clip else ""),
    ]
    for name, m in (("trained", model), ("random twin", twin)):
        for row in structure_of(m, x0, timesteps):
            in_time = f" {row['time_distance']:.2f} ({row['time_ratio']:.2f}) |" if clip else ""
            lines.append(
                f"| {name} | {row['timestep']} | {row['entropy']:.3f} | {row['distance']:.1f} tokens ({row['distance_ratio']:.2f}) |{in_time}"
            )
    return "\n".join(lines)


def nearest_class_accuracy(images: list[np.ndarray], labels: list[int], class_names: list[str], crops_per_photo: int = 256) -> float:
    """Fraction of samples whose nearest training crop (L2 at 16x16, over random crops of every training
    photograph) comes from the photograph the sample was conditioned on: do samples look like their class?"""
    import torch.nn.functional as F

    from .reference.photos import TRAINING, load_photo, random_crops

    photos = {p.name: p for p in TRAINING}
    bank, bank_labels = [], []
    g = torch.Generator().manual_seed(0)
    for label, name in enumerate(class_names):
        if name not in photos:  # a model trained on photographs this version does not list
            continue
        image = load_photo(photos[name], 128)
        crops, _ = random_crops([image], crops_per_photo, 16, g, torch.zeros(crops_per_photo, dtype=torch.long))
        bank.append(crops.flatten(1))
        bank_labels += [label] * crops_per_photo
    firsts = [im[0] if im.ndim == 4 else im for im in images]  # a clip: its first frame
    samples = torch.stack([torch.from_numpy(im).float().permute(2, 0, 1) * 2 - 1 for im in firsts])
    samples = F.interpolate(samples, size=(16, 16), mode="area").flatten(1)
    nearest = torch.cdist(samples, torch.cat(bank)).argmin(1)
    predicted = [bank_labels[i] for i in nearest.tolist()]
    return float(np.mean([p == label for p, label in zip(predicted, labels)]))
