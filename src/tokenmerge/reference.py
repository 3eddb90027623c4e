"""The small trained reference model that judges quality (random weights cannot: their attention is uniform).

A diffusers ``UNet2DConditionModel`` with SD's block structure (CrossAttnDownBlock2D / DownBlock2D /
UpBlock2D / CrossAttnUpBlock2D, BasicTransformerBlocks with self-attention, cross-attention and MLP),
scaled down and working directly on 3-channel images. It is conditioned on which photograph a crop
comes from, given to cross-attention as a short learned token sequence; the extra "null" class is the
unconditional input for classifier-free guidance. Trained by ``scripts/train_reference.py``; the
weights ship with the package (``tokenmerge/assets/reference.safetensors``).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch

UNET_CONFIG: dict[str, Any] = {
    "sample_size": 32,
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "block_out_channels": [32, 64, 128],
    "layers_per_block": 1,
    "attention_head_dim": 32,
    "cross_attention_dim": 64,
    "norm_num_groups": 32,
}
COND_TOKENS = 4
TRAIN_TIMESTEPS = 1000
ASSET = "reference.safetensors"


class ReferenceModel(torch.nn.Module):
    """UNet plus the condition embedding: class ``c`` -> ``COND_TOKENS`` cross-attention tokens."""

    def __init__(self, num_classes: int, class_names: list[str] | None = None) -> None:
        super().__init__()
        from diffusers import UNet2DConditionModel

        self.num_classes = num_classes
        self.class_names = class_names or [f"class {i}" for i in range(num_classes)]
        self.unet = UNet2DConditionModel(**UNET_CONFIG)
        dim = UNET_CONFIG["cross_attention_dim"]
        self.cond = torch.nn.Embedding(num_classes + 1, COND_TOKENS * dim)  # last row: unconditional

    @property
    def null_class(self) -> int:
        return self.num_classes

    def context(self, labels: torch.Tensor) -> torch.Tensor:
        return self.cond(labels).view(labels.shape[0], COND_TOKENS, -1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t, encoder_hidden_states=self.context(labels)).sample


def scheduler_config() -> dict[str, Any]:
    return {"num_train_timesteps": TRAIN_TIMESTEPS, "beta_schedule": "squaredcos_cap_v2", "prediction_type": "epsilon"}


def save_reference(model: ReferenceModel, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
    from safetensors.torch import save_model

    meta = {"num_classes": str(model.num_classes), "class_names": json.dumps(model.class_names)}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    save_model(model.half(), str(path), metadata=meta)
    model.float()


def default_path() -> Path:
    return Path(str(resources.files("tokenmerge") / "assets" / ASSET))


def load_reference(path: str | Path | None = None) -> ReferenceModel:
    """The shipped reference model (fp32, eval mode), or one saved by the training script at ``path``."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    path = Path(path) if path is not None else default_path()
    if not path.exists():
        raise FileNotFoundError(f"no reference model at {path}; train one with scripts/train_reference.py")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    model = ReferenceModel(int(meta["num_classes"]), json.loads(meta["class_names"]))
    load_model(model.half(), str(path))
    return model.float().eval()


@torch.no_grad()
def sample(
    model: ReferenceModel,
    labels: torch.Tensor,
    noise: torch.Tensor,
    steps: int = 25,
    guidance: float = 3.0,
) -> torch.Tensor:
    """DDIM sampling with classifier-free guidance (one batch of 2B: conditional + unconditional).

    Returns images in [-1, 1]. The same ``noise`` gives the same trajectory start for every variant."""
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(**scheduler_config(), clip_sample=True)
    scheduler.set_timesteps(steps)
    x = noise.clone()
    context = model.context(torch.cat([labels, torch.full_like(labels, model.null_class)]))
    for t in scheduler.timesteps:
        eps = model.unet(torch.cat([x, x]), t, encoder_hidden_states=context).sample
        cond, uncond = eps.chunk(2)
        x = scheduler.step(uncond + guidance * (cond - uncond), t, x).prev_sample
    return x.clamp(-1, 1)
