"""How structured a model's high-resolution self-attention is, measured on noised real photographs.

Token reduction loses little where attention is nearly uniform (any average of the keys is then close to
the full attention), so a yardstick model must attend selectively and locally, as trained Stable Diffusion
does. Two numbers per timestep, over the image-query rows of the highest-resolution self-attention:

- normalised entropy: ``-sum p log p / log(keys)``, 1.0 for uniform attention;
- mean attention distance: ``sum_j p_ij |pos_i - pos_j|`` over image keys (in tokens, probabilities
  renormalised over the image keys), and the same for uniform attention on that grid. On a video grid
  (frames, rows, columns) the distance is split: in space (rows and columns) and in time (frames).

The attention probabilities are those the model really computes: queries and keys are captured at the
``scaled_dot_product_attention`` call (after qk-norm and rotary positions), whichever model family.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.overrides import TorchFunctionMode

_SDPA = torch.nn.functional.scaled_dot_product_attention


class _CaptureAttention(TorchFunctionMode):
    """Records (query, key, scale) of every scaled_dot_product_attention call (positional or keyword)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, float | None]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            names = ("query", "key", "value")
            q, k = (args[i] if len(args) > i else kwargs[names[i]] for i in range(2))
            self.calls.append((q.detach(), k.detach(), kwargs.get("scale")))
        return func(*args, **kwargs)


@dataclass
class Structure:
    timestep: int
    entropy: float  # normalised, 1.0 = uniform
    distance: float  # mean attention distance in tokens (video: in space, within rows and columns)
    uniform_distance: float  # the same for uniform attention on the grid
    time_distance: float | None = None  # video: mean attention distance in frames
    uniform_time_distance: float | None = None

    @property
    def distance_ratio(self) -> float:
        return self.distance / self.uniform_distance

    @property
    def time_ratio(self) -> float | None:
        return None if self.time_distance is None else self.time_distance / self.uniform_time_distance

    def as_dict(self) -> dict:
        row = dict(asdict(self), distance_ratio=self.distance_ratio)
        if self.time_distance is None:
            return {k: v for k, v in row.items() if k not in ("time_distance", "uniform_time_distance")}
        return dict(row, time_ratio=self.time_ratio)


def _grid_positions(grid: tuple[int, ...]) -> torch.Tensor:
    axes = torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij")
    return torch.stack([a.flatten() for a in axes], dim=-1).double()


def attention_stats(
    calls: list[tuple[torch.Tensor, torch.Tensor, float | None]], grid: tuple[int, ...], image_first: bool
) -> tuple[float, float, float, float | None, float | None]:
    """(entropy, distance, uniform distance, time distance, uniform time distance) over the calls whose keys
    include the whole ``grid`` of image tokens (the time figures are None on a 2-D grid)."""
    n = math.prod(grid)
    pos = _grid_positions(grid)
    dist = torch.cdist(pos[:, -2:], pos[:, -2:])
    time_dist = torch.cdist(pos[:, :1], pos[:, :1]) if len(grid) == 3 else None
    entropies: list[float] = []
    distances: list[float] = []
    time_distances: list[float] = []
    for q, k, scale in calls:
        sq, sk = q.shape[-2], k.shape[-2]
        if sq < n or sk < n:
            continue
        q_img = slice(0, n) if image_first else slice(sq - n, sq)
        k_img = slice(0, n) if image_first else slice(sk - n, sk)
        s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        for b in range(q.shape[0]):
            for head in range(q.shape[1]):
                logits = (q[b, head, q_img].double() @ k[b, head].double().T) * s
                p = logits.softmax(-1)
                entropies.append((-(p * p.clamp_min(1e-30).log()).sum(-1) / math.log(sk)).mean().item())
                p_img = p[:, k_img]
                p_img = p_img / p_img.sum(-1, keepdim=True)
                distances.append((p_img * dist).sum(-1).mean().item())
                if time_dist is not None:
                    time_distances.append((p_img * time_dist).sum(-1).mean().item())
    if not entropies:
        raise ValueError(f"no self-attention over a {'x'.join(map(str, grid))} token grid was seen")
    if time_dist is None:
        return statistics.fmean(entropies), statistics.fmean(distances), dist.mean().item(), None, None
    return (
        statistics.fmean(entropies),
        statistics.fmean(distances),
        dist.mean().item(),
        statistics.fmean(time_distances),
        time_dist.mean().item(),
    )


def measure(
    run: Callable[[torch.Tensor, torch.Tensor], object],
    x0: torch.Tensor,
    timesteps: tuple[int, ...],
    alphas_cumprod: torch.Tensor,
    grid: tuple[int, ...],
    image_first: bool = True,
    seed: int = 0,
) -> list[Structure]:
    """Noise ``x0`` to each timestep, call ``run(x_t, t)`` and measure its attention over ``grid``."""
    results = []
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x0.shape, generator=g)
    for t in timesteps:
        a = alphas_cumprod[t]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        capture = _CaptureAttention()
        with torch.no_grad(), capture:
            run(xt, torch.tensor(t))
        results.append(Structure(t, *attention_stats(capture.calls, grid, image_first)))
    return results
