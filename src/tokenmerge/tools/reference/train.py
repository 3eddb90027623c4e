"""Train a reference model on random crops of the bundled photographs; checkpointed and resumable.

    tokenmerge train-reference --kind unet --out runs/unet --hours 6      # resumes runs/unet/checkpoint.pt if present
    tokenmerge train-reference --kind flux --out runs/flux --init-from src/tokenmerge/tools/reference/assets/reference-flux.safetensors
    tokenmerge train-reference --kind video --out runs/video --hours 2

Everything is seeded: the data stream's generator state is part of the checkpoint, so an interrupted and
resumed run sees the same crops as an uninterrupted one. SIGINT / SIGTERM save a checkpoint before exiting.
The run writes, into ``--out``: ``checkpoint.pt`` (model, EMA, optimiser, step, data-generator state),
``training.json`` (loss curve and the held-out attention-structure curve) and, at the end, the EMA weights
``reference-<kind>.safetensors`` with the training log in their metadata. That log lets ``--init-from``
continue a run where its folder is gone (a fresh machine): the saved weights become model and EMA, the
optimiser starts afresh with its own warm-up, and the data stream is seeded from (seed, step).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .models import VIDEO_FRAMES, ReferenceModel, load_reference, native_size, read_metadata, save_reference, scheduler_config
from .photos import CLIP_SCALE, DEFAULT_CROP_SCALE, HELD_OUT, TRAINING, load_photo, random_clips, random_crops
from .structure import measure

STRUCTURE_TIMESTEPS = (100, 500, 900)


@dataclass
class TrainConfig:
    kind: str = "unet"
    out: str = "runs/unet"
    steps: int = 10**9
    hours: float = 1.0  # wall-time budget of this invocation (a resumed run gets a new budget)
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 200
    ema: float = 0.999
    cond_dropout: float = 0.15
    seed: int = 0
    log_every: int = 50
    checkpoint_minutes: float = 10.0
    structure_every: int = 250  # steps between attention-structure measurements on held-out photos (0: never)
    max_images: int = 0  # use only the first N photographs (smoke tests)
    photo_side: int = 256
    # Crop side as a fraction of the photograph's shorter side. The default mixes textures and whole scenes;
    # a "content phase" resumed with (0.8, 1.0) teaches whole photographs, so samples show their content.
    crop_scale: tuple[float, float] = DEFAULT_CROP_SCALE
    # Training resolution of this invocation. A cheap low-resolution phase (32 px: a quarter of the tokens, about
    # a sixth of the step time of a UNet) can learn the photographs before a final phase at the evaluation size.
    res: int = 0  # 0: the size the kind is evaluated at (64 px; the video model's frames 32 px)
    # Video: frames per training clip in this invocation (0: the evaluation's VIDEO_FRAMES). Attention cost grows
    # with the square of the frames: 8-frame steps cost three times 4-frame ones.
    frames: int = 0
    init_from: str = ""  # saved reference weights to continue from when --out holds no checkpoint
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_scale must be (min, max) with 0 < min <= max <= 1, got {self.crop_scale}")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema must be in [0, 1), got {self.ema}")
        if self.res and (self.res < 16 or self.res % 16):
            raise ValueError(
                f"res must be a multiple of 16 and at least 16 (the UNet halves it twice, the transformers take 2x2 patches), got {self.res}"
            )


def held_out_batch(res: int = 64, per_photo: int = 2, seed: int = 0, frames: int = 0) -> torch.Tensor:
    """Fixed crops (``frames`` > 0: clips) of the held-out photographs (never trained on)."""
    images = [load_photo(p, 128 if not frames else 256) for p in HELD_OUT]
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(len(images)).repeat_interleave(per_photo)
    if frames:
        return random_clips(images, len(labels), frames, res, g, labels)[0]
    crops, _ = random_crops(images, len(labels), res, g, labels)
    return crops


def grid_of(model: ReferenceModel, res: int, frames: int = 0) -> tuple[int, ...]:
    """The highest-resolution token grid of the model at ``res`` px: 1 token per pixel (UNet) or per 2×2 patch
    (transformers; the video model's grid is (frames, rows, columns))."""
    if model.kind.startswith("unet"):
        return (res, res)
    return (frames, res // 2, res // 2) if model.is_video else (res // 2, res // 2)


def structure_of(model: ReferenceModel, x0: torch.Tensor, timesteps=STRUCTURE_TIMESTEPS) -> list[dict]:
    from diffusers import DDPMScheduler

    alphas = DDPMScheduler(**scheduler_config()).alphas_cumprod
    labels = torch.full((x0.shape[0],), model.null_class)
    grid = grid_of(model, x0.shape[-1], x0.shape[2] if x0.ndim == 5 else 0)
    results = measure(lambda xt, t: model(xt, t, labels), x0, timesteps, alphas, grid, model.image_tokens_first)
    return [r.as_dict() for r in results]


def start_from_weights(cfg: TrainConfig, model: ReferenceModel, ema: ReferenceModel, g: torch.Generator) -> dict:
    """Continue from the reference weights in ``cfg.init_from``: they become model and EMA (the optimiser state
    is not saved with them, so it restarts, warm-up included), the data stream is seeded from (seed, step), and
    the training log in the file's metadata continues."""
    meta = read_metadata(cfg.init_from)
    if "log" not in meta:  # checked before the weights load: no history, no continuation
        raise ValueError(f"--init-from {cfg.init_from} has no training log in its metadata, so its history would be lost")
    source = load_reference(cfg.init_from)
    if source.kind != cfg.kind or source.class_names != model.class_names:
        raise ValueError(
            f"--init-from {cfg.init_from} holds a {source.kind} model over {len(source.class_names)} photographs; "
            f"this run trains {cfg.kind} on {len(model.class_names)}"
        )
    model.load_state_dict(source.state_dict())
    ema.load_state_dict(source.state_dict())
    log_data = json.loads(meta["log"])
    log_data["optimizer_from"] = log_data["step"]
    g.manual_seed(cfg.seed * 2**32 + log_data["step"])
    return log_data


class Run:
    """The resumable state of a training run in a folder, shared by ``train-reference`` and ``distill-reference``:
    model, EMA, optimiser, data generator and log, checkpointed atomically as ``checkpoint.pt`` (the log beside it as
    ``training.json``) every ``checkpoint_minutes`` and when the run ends or is stopped by SIGINT / SIGTERM; the wall
    time between saves adds to the log's ``seconds``; one optimiser step with the EMA update and the loss log."""

    def __init__(
        self, out: Path, model, ema, optimizer, generator: torch.Generator, log_data: dict, checkpoint_minutes: float, log_every: int, log
    ) -> None:
        self.out, self.path = out, out / "checkpoint.pt"
        self.model, self.ema, self.optimizer, self.generator = model, ema, optimizer, generator
        self.log_data, self.checkpoint_minutes, self.log_every, self.log = log_data, checkpoint_minutes, log_every, log
        self.running, self.counted = 0.0, 0  # the loss since the last log line (fewer steps after a resume)
        self.stopped = False

    def resume(self) -> bool:
        """Load the folder's checkpoint, if it holds one."""
        if not self.path.exists():
            return False
        state = torch.load(self.path, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.log_data = state["log"]
        self.log(f"resumed {self.path} at step {self.log_data['step']}")
        return True

    def save(self) -> None:
        self.log_data["seconds"] += time.monotonic() - self.since
        self.since = time.monotonic()
        state = {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "log": self.log_data,
        }
        torch.save(state, self.path.with_suffix(".tmp"))
        self.path.with_suffix(".tmp").replace(self.path)
        (self.out / "training.json").write_text(json.dumps(self.log_data, indent=1))

    @contextlib.contextmanager
    def steps(self) -> Iterator[None]:
        """Around the training loop: the wall-time clock starts, SIGINT / SIGTERM set :attr:`stopped`, and the end
        (or an error) saves a checkpoint before the signal handlers are restored."""
        self.since = time.monotonic()
        self.next_checkpoint = time.monotonic() + self.checkpoint_minutes * 60

        def request_stop(signum, frame):
            self.stopped = True

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            self.save()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def update(self, loss: torch.Tensor, decay: float) -> int:
        """One optimiser step on ``loss`` (gradients clipped to norm 1), the EMA moved by ``1 - decay``, the step
        counted and the mean loss logged every ``log_every`` steps; returns the new step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        with torch.no_grad():
            for pe, pm in zip(self.ema.parameters(), self.model.parameters()):
                pe.lerp_(pm, 1 - decay)
        self.log_data["step"] = step = self.log_data["step"] + 1
        self.running, self.counted = self.running + loss.item(), self.counted + 1
        if step % self.log_every == 0:
            elapsed = self.log_data["seconds"] + time.monotonic() - self.since
            self.log_data["losses"].append([step, self.running / self.counted, round(elapsed)])
            self.log(f"step {step}  loss {self.running / self.counted:.4f}  {elapsed / 60:.1f} min", flush=True)
            self.running, self.counted = 0.0, 0
        return step

    def checkpoint_due(self) -> None:
        """Save a checkpoint if ``checkpoint_minutes`` have passed since the last one."""
        if time.monotonic() > self.next_checkpoint:
            self.save()
            self.next_checkpoint = time.monotonic() + self.checkpoint_minutes * 60


def train(cfg: TrainConfig, log=print) -> Path:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    photos = TRAINING[: cfg.max_images] if cfg.max_images else TRAINING
    images = [load_photo(p, cfg.photo_side) for p in photos]
    res = cfg.res or native_size(cfg.kind)
    frames = (cfg.frames or VIDEO_FRAMES) if cfg.kind == "video" else 0
    names = [p.name for p in photos]
    torch.manual_seed(cfg.seed)
    model = ReferenceModel(cfg.kind, len(images), names)
    ema = ReferenceModel(cfg.kind, len(images), names)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(cfg.seed)
    log_data = {"config": asdict(cfg), "photos": names, "losses": [], "structure": [], "seconds": 0.0, "step": 0}
    run = Run(out, model, ema, optimizer, g, log_data, cfg.checkpoint_minutes, cfg.log_every, log)
    from_weights = not run.path.exists() and bool(cfg.init_from)  # --init-from only starts a run folder
    if run.resume():
        log_data = run.log_data
    elif from_weights:
        log_data = run.log_data = start_from_weights(cfg, model, ema, g)
        log(f"continuing from the weights in {cfg.init_from} at step {log_data['step']} (fresh optimiser)")
    # Where each invocation ran, for the card's wall-time figure (a resumed run may run elsewhere).
    machine = f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    # What each invocation ran with, where a resumed run may differ from the first (the card lists the phases).
    phase = {"crop_scale": list(cfg.crop_scale), "lr": cfg.lr, "ema": cfg.ema, "res": res}
    if frames:
        phase["frames"] = frames
    if from_weights:
        phase["from_weights"] = Path(cfg.init_from).name
    log_data.setdefault("runs", []).append({"from_step": log_data["step"], "machine": machine, **phase})
    params = sum(p.numel() for p in model.parameters())
    log(f"{cfg.kind} reference model: {params / 1e6:.2f} M parameters, {len(images)} photographs, {torch.get_num_threads()} threads")
    from diffusers import DDPMScheduler

    alphas = DDPMScheduler(**scheduler_config()).alphas_cumprod
    held_out = held_out_batch(native_size(cfg.kind), frames=frames and VIDEO_FRAMES) if cfg.structure_every else None
    deadline = time.monotonic() + cfg.hours * 3600
    started_step = log_data["step"]
    with run.steps():
        while log_data["step"] < cfg.steps and time.monotonic() < deadline and not run.stopped:
            step = log_data["step"]
            if frames:
                x0, labels = random_clips(images, cfg.batch, frames, res, g, scale=CLIP_SCALE)
            else:
                x0, labels = random_crops(images, cfg.batch, res, g, scale=cfg.crop_scale)
            labels = torch.where(torch.rand(cfg.batch, generator=g) < cfg.cond_dropout, model.null_class, labels)
            t = torch.randint(0, len(alphas), (cfg.batch,), generator=g)
            noise = torch.randn(x0.shape, generator=g)
            a = alphas[t].view(-1, *[1] * (x0.ndim - 1))
            xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(1.0, (step - log_data.get("optimizer_from", 0) + 1) / cfg.warmup)
            loss = F.mse_loss(model(xt, t, labels), noise)
            step = run.update(loss, min(cfg.ema, (1 + step) / (10 + step)))
            if held_out is not None and step % cfg.structure_every == 0:
                ema.eval()
                curve = structure_of(ema, held_out, (500,))
                log_data["structure"].append({"step": step, **curve[0]})
                in_time = f", in time {curve[0]['time_ratio']:.2f}x" if "time_ratio" in curve[0] else ""
                log(
                    f"step {step}  held-out attention at t=500: entropy {curve[0]['entropy']:.3f}, distance {curve[0]['distance_ratio']:.2f}x uniform{in_time}",
                    flush=True,
                )
            run.checkpoint_due()
    weights = out / f"reference-{cfg.kind}.safetensors"
    save_reference(ema, weights, {"steps": log_data["step"], "train_res": res, "seed": cfg.seed, "log": log_data})
    log(f"saved {weights} at step {log_data['step']} ({log_data['step'] - started_step} steps this run)")
    return weights
