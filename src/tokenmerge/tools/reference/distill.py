"""Distil the Flux-style reference model to a few-step one: the yardstick for distilled models (FLUX.1 schnell,
FLUX.2 Klein, Z-Image-Turbo), where each step carries more of the image than in a 20-50 step loop.

    tokenmerge distill-reference --out runs/flux-distilled --hours 1.5     # resumes what --out holds

The objective is segment-wise trajectory distillation with the guidance distilled in (TRACT, Berthelot et al.
2023; guided distillation, Meng et al. 2023): the teacher (``reference-flux``, DDIM with CFG 3) runs
``TEACHER_STEPS`` evenly strided steps from t = ``T_MAX`` to the clean image from many noises, and the student
(initialised from the teacher) learns to take one DDIM step, *without* CFG, from the teacher's state at a
student timestep to its state ``STRIDES`` teacher steps later: 4 teacher steps (the 4-step schedule 960, 720, 480,
240) or 2 (the 8-step one). Why this objective: it trains exactly the sampler the yardstick runs (a few evenly
strided steps, one model call each, no CFG, as the distilled Flux models are sampled), it needs the teacher's
trajectories only once (cheap enough for two CPU cores, unlike progressive distillation's rounds), and its loss
is the teacher's own epsilon MSE (the DDIM step is linear in the predicted noise, so the teacher's next state
gives the noise that reaches it exactly).

Resumable: the trajectories are written in chunks and training checkpoints every few minutes.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .models import (
    ReferenceModel,
    alphas_cumprod,
    ddim_step,
    even_timesteps,
    load_reference,
    native_size,
    read_metadata,
    sample,
    save_reference,
    shipped,
)
from .train import Run

T_MAX = 960  # the first timestep: as DDIM's 20-step schedule starts at 950, where the image is all but pure noise
TEACHER_STEPS = 16
TEACHER_GUIDANCE = 3.0
STRIDES = {4: 2 / 3, 2: 1 / 3}  # teacher steps per student step -> share of the training segments (4 and 8 steps)
CHUNK = 32  # trajectories per saved chunk


@dataclass
class DistillConfig:
    out: str = "runs/flux-distilled"
    teacher: str = ""  # default: the shipped reference-flux
    trajectories: int = 1024
    hours: float = 1.5  # wall-time budget of this invocation (trajectories and training together)
    steps: int = 10**9
    batch: int = 16
    lr: float = 2e-4
    warmup: int = 100
    ema: float = 0.995
    seed: int = 0
    log_every: int = 25
    checkpoint_minutes: float = 10.0


def teacher_trajectories(teacher: ReferenceModel, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The teacher's DDIM states (B, TEACHER_STEPS + 1, 3, H, W) from ``noise`` at T_MAX to the clean image."""
    alphas = alphas_cumprod()
    timesteps = even_timesteps(TEACHER_STEPS, T_MAX)
    x, states = noise.clone(), [noise.clone()]
    both = torch.cat([labels, torch.full_like(labels, teacher.null_class)])
    with torch.no_grad():
        for i, t in enumerate(timesteps):
            cond, uncond = teacher(torch.cat([x, x]), torch.tensor(t), both).chunk(2)
            a_next = alphas[timesteps[i + 1]] if i + 1 < len(timesteps) else 1.0
            x = ddim_step(x, uncond + TEACHER_GUIDANCE * (cond - uncond), alphas[t], a_next, clip=True)
            states.append(x.clone())
    return torch.stack(states, 1)


def _chunks(out: Path) -> list[Path]:
    return sorted(out.glob("trajectories-*.pt"))


def trajectory_hours(out: Path) -> float:
    """The wall time the teacher's trajectories took, from their chunk files' times: the median gap between
    consecutive chunks, times the chunks (a pause between invocations does not count)."""
    times = sorted(p.stat().st_mtime for p in _chunks(Path(out)))
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[len(gaps) // 2] * len(times) / 3600 if gaps else 0.0


def make_trajectories(cfg: DistillConfig, teacher: ReferenceModel, deadline: float, log=print) -> None:
    """Write the teacher's trajectories in chunks of CHUNK (noise and labels seeded per chunk: resumable)."""
    out, size = Path(cfg.out), native_size("flux")
    for index in range(len(_chunks(out)), -(-cfg.trajectories // CHUNK)):
        if time.monotonic() > deadline:
            return
        g = torch.Generator().manual_seed(cfg.seed * 10**6 + index)
        labels = torch.randint(0, teacher.num_classes, (CHUNK,), generator=g)
        noise = torch.randn(CHUNK, 3, size, size, generator=g)
        started = time.monotonic()
        states = teacher_trajectories(teacher, noise, labels)
        torch.save({"states": states.half(), "labels": labels}, out / f"trajectories-{index:04d}.pt")
        log(f"trajectories {(index + 1) * CHUNK}/{cfg.trajectories} ({time.monotonic() - started:.0f} s per chunk)", flush=True)


def segment_batch(states: torch.Tensor, labels: torch.Tensor, batch: int, g: torch.Generator):
    """Random (state, timestep, label, epsilon target) of student steps: the noise that takes one DDIM step from a
    teacher state at a student timestep exactly to the teacher's state ``stride`` steps later."""
    alphas = alphas_cumprod()
    grid = list(even_timesteps(TEACHER_STEPS, T_MAX))
    strides = torch.tensor(list(STRIDES))
    pick = torch.multinomial(torch.tensor(list(STRIDES.values())), batch, replacement=True, generator=g)
    which = torch.randint(0, len(states), (batch,), generator=g)
    xs, ts, targets = [], [], []
    for n, stride in zip(which.tolist(), strides[pick].tolist()):
        k = stride * int(torch.randint(0, TEACHER_STEPS // stride, (1,), generator=g))
        x_a, x_b = states[n, k].float(), states[n, k + stride].float()
        a = alphas[grid[k]]
        a_b = alphas[grid[k + stride]] if k + stride < TEACHER_STEPS else torch.tensor(1.0)
        # x_b = sqrt(a_b / a) x_a + (sqrt(1 - a_b) - sqrt(a_b (1 - a) / a)) eps  (ddim_step, no clipping)
        coef = (1 - a_b).sqrt() - (a_b * (1 - a) / a).sqrt()
        xs.append(x_a)
        ts.append(grid[k])
        targets.append((x_b - (a_b / a).sqrt() * x_a) / coef)
    return torch.stack(xs), torch.tensor(ts), labels[which], torch.stack(targets)


def distill(cfg: DistillConfig, log=print) -> Path:
    """Make (or finish making) the teacher's trajectories, then train the student; returns its EMA weights."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    teacher_path = Path(cfg.teacher or shipped("flux"))
    teacher = load_reference(teacher_path)
    deadline = time.monotonic() + cfg.hours * 3600
    make_trajectories(cfg, teacher, deadline, log)
    chunks = [torch.load(p) for p in _chunks(out)]
    states = torch.cat([c["states"] for c in chunks])
    labels = torch.cat([c["labels"] for c in chunks])
    log(f"{len(states)} teacher trajectories ({TEACHER_STEPS} DDIM steps, CFG {TEACHER_GUIDANCE:g})")
    model = ReferenceModel("flux", teacher.num_classes, teacher.class_names)
    model.load_state_dict(teacher.state_dict())
    ema = ReferenceModel("flux", teacher.num_classes, teacher.class_names)
    ema.load_state_dict(teacher.state_dict())
    ema.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(cfg.seed)
    log_data = {"config": asdict(cfg), "teacher": teacher_path.name, "losses": [], "seconds": 0.0, "step": 0, "runs": []}
    run = Run(out, model, ema, optimizer, g, log_data, cfg.checkpoint_minutes, cfg.log_every, log)
    if run.resume():
        log_data = run.log_data
    machine = f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    log_data["runs"].append({"from_step": log_data["step"], "machine": machine, "trajectories": len(states)})
    started = log_data["step"]
    model.train()
    with run.steps():
        while log_data["step"] < cfg.steps and time.monotonic() < deadline and not run.stopped:
            step = log_data["step"]
            x, t, y, target = segment_batch(states, labels, cfg.batch, g)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(1.0, (step - started + 1) / cfg.warmup)
            run.update(F.mse_loss(model(x, t, y), target), cfg.ema)
            run.checkpoint_due()
    weights = out / "reference-flux-distilled.safetensors"
    sampling = {"t_max": T_MAX, "steps": 4, "guidance": None, "teacher": teacher_path.name, "teacher_steps": TEACHER_STEPS}
    save_reference(ema, weights, {"steps": log_data["step"], "seed": cfg.seed, "sampling": sampling, "log": log_data})
    log(f"saved {weights} at step {log_data['step']} ({log_data['step'] - started} steps this run)")
    return weights


@torch.no_grad()
def fidelity(student: ReferenceModel, teacher: ReferenceModel, steps: int, seeds: range) -> dict:
    """PSNR (dB, mean over seeds) against the teacher's own TEACHER_STEPS-step CFG sample from the same noise, of the
    student at ``steps`` steps and of the teacher itself run at ``steps`` DDIM steps with CFG (what the student
    improves on)."""
    size = native_size("flux")
    labels = torch.tensor([s % teacher.num_classes for s in seeds])
    noise = torch.stack([torch.randn(3, size, size, generator=torch.Generator().manual_seed(s)) for s in seeds])
    target = teacher_trajectories(teacher, noise, labels)[:, -1].clamp(-1, 1)
    alphas = alphas_cumprod()
    timesteps = even_timesteps(steps, T_MAX)
    x = noise.clone()
    both = torch.cat([labels, torch.full_like(labels, teacher.null_class)])
    for i, t in enumerate(timesteps):
        cond, uncond = teacher(torch.cat([x, x]), torch.tensor(t), both).chunk(2)
        x = ddim_step(
            x, uncond + TEACHER_GUIDANCE * (cond - uncond), alphas[t], alphas[timesteps[i + 1]] if i + 1 < steps else 1.0, clip=True
        )
    few = x.clamp(-1, 1)
    distilled = sample(student, labels, noise, steps=steps)

    def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
        mse = ((a - b) / 2).pow(2).flatten(1).mean(1)
        return float((-10 * mse.log10()).mean())

    return {"steps": steps, "student_psnr": psnr(distilled, target), "teacher_few_step_psnr": psnr(few, target), "seeds": len(seeds)}


def finish(run: Path, log=print) -> Path:
    """Measure the distilled model of ``run`` (fidelity at 4 and 8 steps, samples, structure) and write its card."""
    from ..evaluate import nearest_class_accuracy
    from .card import save_grid
    from .train import held_out_batch, structure_of

    run = Path(run)
    weights = run / "reference-flux-distilled.safetensors"
    data = json.loads((run / "training.json").read_text())
    student = load_reference(weights)
    teacher = load_reference(shipped("flux") if not data["config"]["teacher"] else data["config"]["teacher"])
    measured = {"fidelity": [fidelity(student, teacher, n, range(1000, 1032)) for n in (4, 8)]}
    measured["structure"] = structure_of(student, held_out_batch(native_size("flux")), (100, 500, 900))
    labels = torch.arange(student.num_classes).repeat_interleave(2)
    size = native_size("flux")
    noise = torch.randn(len(labels), 3, size, size, generator=torch.Generator().manual_seed(0))
    images = sample(student, labels, noise, steps=4)
    save_grid(images, weights.with_suffix(".png"), columns=8)
    arrays = [((im.permute(1, 2, 0).numpy() + 1) / 2).astype("float64") for im in images]
    measured["nearest_class_accuracy"] = nearest_class_accuracy(arrays, labels.tolist(), student.class_names)
    weights.with_suffix(".json").write_text(json.dumps(measured, indent=1))
    path = write_card(weights, data, measured)
    log(f"wrote {path}")
    return path


def write_card(weights: Path, log: dict, measured: dict) -> Path:
    config = log["config"]
    meta = json.loads(read_metadata(weights)["sampling"])
    losses = log["losses"]
    stride = max(1, len(losses) // 16)
    loss_rows = "\n".join(f"| {s} | {loss:.4f} | {sec / 3600:.2f} |" for s, loss, sec in losses[::stride] + losses[-1:])
    fid = "\n".join(f"| {f['steps']} | {f['student_psnr']:.1f} | {f['teacher_few_step_psnr']:.1f} |" for f in measured["fidelity"])
    structure = "\n".join(f"| {r['timestep']} | {r['entropy']:.3f} | {r['distance_ratio']:.2f} |" for r in measured["structure"])
    machines = "; ".join(sorted({r["machine"] for r in log["runs"]}))
    text = f"""# tokenmerge reference model: flux-distilled (4 steps)

Generated by `tokenmerge distill-reference` from the run's log; not edited by hand. The Flux-style reference
model ({meta["teacher"]}) distilled to sample in {meta["steps"]} steps without classifier-free guidance, as FLUX.1 schnell,
FLUX.2 Klein and Z-Image-Turbo are: the yardstick of what token reduction costs on few-step models.

- Architecture: the teacher's (diffusers `FluxTransformer2DModel`, `CONFIGS["flux"]`), initialised from it.
- Sampling (`tokenmerge.tools.reference.models.sample(model, labels, noise, steps=4)`, read from the metadata
  `sampling` = `{json.dumps(meta)}`): DDIM (eta 0) at timesteps {", ".join(map(str, even_timesteps(4, meta["t_max"])))} then to
  the clean image, one model call per step, no CFG (8 steps: every 120 from {meta["t_max"]}).
- Objective: segment-wise trajectory distillation with the guidance distilled in (TRACT, Berthelot et al. 2023;
  Meng et al. 2023): the teacher runs {TEACHER_STEPS} DDIM steps with CFG {TEACHER_GUIDANCE:g} from t = {T_MAX} on {log["runs"][-1]["trajectories"]}
  noises (random photograph classes); the student learns one step from the teacher's state at a student timestep
  to its state 4 teacher steps later (2/3 of the segments, the 4-step schedule) or 2 (1/3, the 8-step one), as an
  epsilon MSE (the noise whose DDIM step lands exactly on the teacher's state).
- Training: {log["step"]} steps, batch {config["batch"]}, AdamW lr {config["lr"]} (warm-up {config["warmup"]} steps in each of the {len(log["runs"])} invocations), EMA {config["ema"]}, seed
  {config["seed"]}, {log["seconds"] / 3600:.1f} h of wall time for the training steps ({machines}), after
  {trajectory_hours(weights.parent):.1f} h for the teacher's trajectories (from their chunk files' times;
  `tokenmerge distill-reference --out DIR` resumes both).

## Fidelity to the teacher

PSNR (dB, mean over 32 seeds) against the teacher's own {TEACHER_STEPS}-step CFG sample from the same noise: the
distilled model, and the teacher run at the same few DDIM steps with CFG (twice the model calls).

| steps | distilled | teacher at those steps |
|---|---|---|
{fid}

## Attention structure

Held-out crops noised to t, null condition (as the other cards): normalised entropy (1 = uniform) and mean attention
distance against uniform attention.

| t | entropy | distance (x uniform) |
|---|---|---|
{structure}

## Samples

`{weights.with_suffix(".png").name}`: 2 samples per photograph class (classes in order, 4 per row), 4 steps.
Nearest-class check: {measured["nearest_class_accuracy"]:.0%} of the samples have their nearest training crop in the photograph
they were conditioned on (chance: {1 / len(json.loads(read_metadata(weights)["class_names"])):.0%}).

## Loss (epsilon MSE per {config["log_every"]} steps)

| step | loss | wall hours |
|---|---|---|
{loss_rows}
"""
    path = weights.with_suffix(".md")
    path.write_text(text)
    return path
