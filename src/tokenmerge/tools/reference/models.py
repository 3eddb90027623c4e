"""The small trained reference models that judge quality (random weights cannot: their attention is uniform).

Three backbones, each a real diffusers class at a small size, working directly on 64×64 RGB images and
conditioned on which photograph an image comes from (``COND_TOKENS`` learned tokens, plus a "null" class
for classifier-free guidance):

- ``unet``: ``UNet2DConditionModel`` with Stable Diffusion's block structure (CrossAttnDownBlock2D /
  DownBlock2D / UpBlock2D / CrossAttnUpBlock2D; BasicTransformerBlocks with self-attention,
  cross-attention and MLP); its top level has 64×64 = 4096 tokens, as SD 1.5 at 512 px.
- ``sd3``: ``SD3Transformer2DModel`` (MMDiT joint attention over image and condition tokens, absolute
  position embedding, qk-norm), 2×2 patches: 32×32 = 1024 image tokens.
- ``flux``: ``FluxTransformer2DModel`` (double- and single-stream blocks, rotary positions inside
  attention), 2×2 packed pixels: 1024 image tokens.
- ``video``: ``WanTransformer3DModel`` (Wan 2.1's blocks: self-attention with 3-D rotary positions over
  frames × rows × columns, cross-attention to the condition, MLP), 1×2×2 patches on clips of ``VIDEO_FRAMES``
  frames at 32×32 px: 4×16×16 = 1024 video tokens, as many as the image transformers' 64 px grid. Clips are pans and zooms over the photographs
  (:func:`tokenmerge.tools.reference.photos.random_clips`), so neighbouring frames are nearly alike, as in
  real video.

All three are trained with the same DDPM epsilon objective (the token layout and attention are what token
reduction acts on; SD3 and Flux's flow-matching objective would not change that), sampled with DDIM.

Note on diffusers' UNet: its ``attention_head_dim`` argument is the number of heads (a known naming
quirk); the configs below give every attention head 32 channels. The first reference model (v1) passed 32
there and so had 32 heads of 1 channel at its top level: rank-one attention maps that cannot attend
locally, which is why its attention was nearly uniform.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

COND_TOKENS = 4
TRAIN_TIMESTEPS = 1000
IMAGE_SIZE = 64
VIDEO_SIZE = 32  # the video model's frame side in px
VIDEO_FRAMES = 4
KINDS = ("unet", "sd3", "flux", "video")
# Shipped models beyond one per architecture: the Flux-style model distilled to few steps (:mod:`.distill`).
DISTILLED = ("flux-distilled",)
SHIPPED = KINDS + DISTILLED
# What `tokenmerge eval` judges with by default: the UNet v2 architecture, trained at 32 px and finished at the 64 px it is evaluated at.
DEFAULT_KIND = "unet"

CONFIGS: dict[str, dict[str, Any]] = {
    "unet": {
        "sample_size": IMAGE_SIZE,
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
        "block_out_channels": [32, 64, 128],
        "layers_per_block": 1,
        "attention_head_dim": [1, 2, 4],  # heads per level (diffusers' naming): 32 channels per head
        "cross_attention_dim": 64,
        "norm_num_groups": 32,
    },
    "sd3": {
        "sample_size": IMAGE_SIZE,
        "patch_size": 2,
        "in_channels": 3,
        "out_channels": 3,
        "num_layers": 6,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": 64,
        "caption_projection_dim": 128,
        "pooled_projection_dim": 64,
        "pos_embed_max_size": IMAGE_SIZE // 2,
        "qk_norm": "rms_norm",
    },
    "flux": {
        "patch_size": 1,
        "in_channels": 12,  # 3 channels × 2×2 packed pixels
        "num_layers": 2,
        "num_single_layers": 4,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": 64,
        "pooled_projection_dim": 64,
        "guidance_embeds": False,
        "axes_dims_rope": [8, 12, 12],
    },
    "video": {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "in_channels": 3,
        "out_channels": 3,
        "text_dim": 64,
        "freq_dim": 64,
        "ffn_dim": 512,
        "num_layers": 4,
        "rope_max_seq_len": 64,
    },
}


def _is_unet(kind: str) -> bool:
    return kind == "unet"


def _cond_dim(kind: str) -> int:
    config = CONFIGS[kind]
    return config["cross_attention_dim"] if _is_unet(kind) else config["text_dim" if kind == "video" else "joint_attention_dim"]


def native_size(kind: str) -> int:
    """The side in px a reference model of ``kind`` is trained and judged at."""
    return VIDEO_SIZE if kind == "video" else IMAGE_SIZE


def backbone_class(kind: str) -> str:
    if _is_unet(kind):
        return "UNet2DConditionModel"
    return {"sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel", "video": "WanTransformer3DModel"}[kind]


class ReferenceModel(torch.nn.Module):
    """A backbone (``denoiser``) plus the condition embedding: class ``c`` -> ``COND_TOKENS`` tokens."""

    def __init__(self, kind: str, num_classes: int, class_names: list[str] | None = None) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.num_classes = num_classes
        self.class_names = class_names or [f"class {i}" for i in range(num_classes)]
        import diffusers

        self.denoiser = getattr(diffusers, backbone_class(kind))(**CONFIGS[kind])
        dim = _cond_dim(kind)
        self.cond = torch.nn.Embedding(num_classes + 1, COND_TOKENS * dim)  # last row: unconditional
        self.pooled = None if _is_unet(kind) or kind == "video" else torch.nn.Embedding(num_classes + 1, dim)
        # How a few-step distilled model is sampled (its metadata's "sampling": t_max, steps, guidance None); None:
        # DDIM with classifier-free guidance.
        self.sampling: dict[str, Any] | None = None

    @property
    def null_class(self) -> int:
        return self.num_classes

    @property
    def image_tokens_first(self) -> bool:
        """Order of image and condition tokens in joint attention (SD3: image first; Flux: text first)."""
        return self.kind != "flux"

    def context(self, labels: torch.Tensor) -> torch.Tensor:
        return self.cond(labels).view(labels.shape[0], COND_TOKENS, -1)

    @property
    def is_video(self) -> bool:
        return self.kind == "video"

    def forward(self, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Predicted noise for images ``x`` (B, 3, H, W) or clips (B, 3, F, H, W) at timesteps ``t`` (0..999)."""
        context = self.context(labels)
        if _is_unet(self.kind):  # a 0-d timestep as a pipeline passes it (the UNet broadcasts it; DeepCache reads it)
            return self.denoiser(x, t, encoder_hidden_states=context).sample
        t = t.expand(x.shape[0]) if t.ndim else t.repeat(x.shape[0])
        if self.is_video:
            return self.denoiser(hidden_states=x, timestep=t, encoder_hidden_states=context).sample
        pooled = self.pooled(labels)
        if self.kind == "sd3":
            return self.denoiser(hidden_states=x, encoder_hidden_states=context, pooled_projections=pooled, timestep=t).sample
        b, c, h, w = x.shape
        packed = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
        out = self.denoiser(
            hidden_states=packed,
            encoder_hidden_states=context,
            pooled_projections=pooled,
            timestep=t.float() / TRAIN_TIMESTEPS,  # Flux scales by 1000 itself
            img_ids=flux_image_ids(h // 2, w // 2, x.device),
            txt_ids=torch.zeros(COND_TOKENS, 3, device=x.device),
        ).sample
        return out.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def flux_image_ids(h: int, w: int, device: torch.device | None = None) -> torch.Tensor:
    """Flux's (h*w, 3) position ids (0, row, col) of a row-major token grid."""
    ids = torch.zeros(h, w, 3, device=device)
    ids[..., 1] = torch.arange(h, device=device)[:, None]
    ids[..., 2] = torch.arange(w, device=device)[None, :]
    return ids.reshape(h * w, 3)


def scheduler_config() -> dict[str, Any]:
    return {"num_train_timesteps": TRAIN_TIMESTEPS, "beta_schedule": "squaredcos_cap_v2", "prediction_type": "epsilon"}


def save_reference(model: ReferenceModel, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
    """fp16 safetensors with what loading needs (kind, classes) in its metadata."""
    from safetensors.torch import save_file

    meta = {"kind": model.kind, "num_classes": str(model.num_classes), "class_names": json.dumps(model.class_names)}
    meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()})
    tensors = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata=meta)


def read_metadata(path: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return dict(f.metadata())


def shipped(kind: str = "unet") -> Path:
    """The path of the reference model of ``kind``: beside this module, in the repository (the wheel carries neither
    the reference models nor their code; they come with a clone, ``pip install -e .``)."""
    return Path(__file__).parent / "assets" / f"reference-{kind}.safetensors"


def load_reference(path: str | Path) -> ReferenceModel:
    """A reference model saved by :func:`save_reference` (fp32, eval mode)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no reference model at {path}")
    meta = read_metadata(path)
    if "kind" not in meta:
        raise ValueError(f"{path} is a reference model of tokenmerge 0.1 (unet-v1), which this version no longer loads")
    model = ReferenceModel(meta["kind"], int(meta["num_classes"]), json.loads(meta["class_names"]))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    model.sampling = json.loads(meta["sampling"]) if "sampling" in meta else None
    return model.eval()


def _ddim(steps: int) -> Any:
    """The DDIM scheduler :func:`sample` runs, set to ``steps`` steps."""
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(**scheduler_config(), clip_sample=True)
    scheduler.set_timesteps(steps)
    return scheduler


def ddim_timesteps(steps: int) -> tuple[int, ...]:
    """The timesteps a DDIM reference model's :func:`sample` runs, high noise first."""
    return tuple(int(t) for t in _ddim(steps).timesteps)


def alphas_cumprod() -> torch.Tensor:
    """ᾱ_t of the training noise schedule, t = 0..TRAIN_TIMESTEPS-1."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(**scheduler_config()).alphas_cumprod


def even_timesteps(steps: int, t_max: int) -> tuple[int, ...]:
    """``steps`` timesteps from ``t_max`` down in equal strides (the last step goes from the smallest to the clean
    image): the schedule a distilled model is trained and sampled on (4 steps from 960: 960, 720, 480, 240)."""
    return tuple(round(t_max * (1 - i / steps)) for i in range(steps))


def sampler_timesteps(model: ReferenceModel, steps: int) -> tuple[int, ...]:
    """The timesteps :func:`sample` runs ``model`` at in ``steps`` steps, high noise first."""
    return even_timesteps(steps, model.sampling["t_max"]) if model.sampling else ddim_timesteps(steps)


def ddim_step(x: torch.Tensor, eps: torch.Tensor, a: torch.Tensor, a_next: torch.Tensor | float, clip: bool = False) -> torch.Tensor:
    """One deterministic DDIM step (eta 0) from noise level ᾱ = ``a`` to ``a_next`` (1: the clean image) given the
    predicted noise; ``clip`` clamps the predicted clean image to [-1, 1] as diffusers' ``clip_sample`` does."""
    a_next = torch.as_tensor(a_next, dtype=x.dtype)
    x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
    if clip:
        x0 = x0.clamp(-1, 1)
    return a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps


@torch.no_grad()
def sample(
    model: ReferenceModel,
    labels: torch.Tensor,
    noise: torch.Tensor,
    steps: int = 20,
    guidance: float | None = None,
    clock: Any = None,
) -> torch.Tensor:
    """Sample images in [-1, 1] as the model is meant to be sampled: DDIM with classifier-free guidance (one batch
    of 2B, conditional + unconditional; ``guidance`` None: 3.0), or, for a few-step distilled model, its own
    evenly strided timesteps with the guidance distilled in (one batch of B; a ``guidance`` is refused).

    The same ``noise`` starts the same trajectory for every variant compared. Clips: ``noise`` (B, 3, F, H, W).
    Each model call runs in the cache context diffusers' step caches need; ``clock`` (:class:`tokenmerge.tools.caches.
    Clock`) is told each step's timestep, for the caches that read it."""
    from ..caches import end_loop, step_context

    if model.sampling is not None and guidance is not None:
        raise ValueError(f"guidance: this model is guidance-distilled (sampled without classifier-free guidance), got {guidance}")
    guidance = 3.0 if guidance is None else guidance
    x = noise.clone()
    try:
        if model.sampling is not None:
            alphas = alphas_cumprod()
            timesteps = sampler_timesteps(model, steps)
            for i, t in enumerate(timesteps):
                if clock is not None:
                    clock.timestep = float(t)
                with step_context(model.denoiser):
                    eps = model(x, torch.tensor(t), labels)
                x = ddim_step(x, eps, alphas[t], alphas[timesteps[i + 1]] if i + 1 < steps else 1.0)
            return x.clamp(-1, 1)
        scheduler = _ddim(steps)
        both = torch.cat([labels, torch.full_like(labels, model.null_class)])
        for t in scheduler.timesteps:
            if clock is not None:
                clock.timestep = float(t)
            with step_context(model.denoiser):
                eps = model(torch.cat([x, x]), t, both)
            cond, uncond = eps.chunk(2)
            x = scheduler.step(uncond + guidance * (cond - uncond), t, x).prev_sample
    finally:
        end_loop(model.denoiser)
    return x.clamp(-1, 1)
