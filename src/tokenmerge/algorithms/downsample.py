"""Token downsampling (ToDo, arXiv 2402.13573): attention keys and values from a spatially smaller copy.

Two forms of the same operation:

- :func:`downsample_tokens` shrinks the (B, h*w, C) tokens a self-attention computes its keys and values
  from (the cheapest form: the key/value projections then run on fewer tokens);
- :func:`downsample_keys` shrinks the image part of already projected keys or values (B, H, S, D) inside a
  longer sequence of text and image tokens, where the projection cannot be reached (joint attention, fused
  projections) or where positions are applied after it (rotary embeddings: reducing after them keeps every
  kept key's exact position).

Both are linear maps over tokens whose weights sum to one (nearest, bilinear, bicubic, area), so they
commute with the projections: both forms give the same keys up to float rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def downsampled_size(h: int, w: int, factor: int) -> tuple[int, int]:
    return math.ceil(h / factor), math.ceil(w / factor)


def downsample_tokens(x: torch.Tensor, h: int, w: int, factor: int, mode: str) -> torch.Tensor:
    """(B, h*w, C) -> (B, ceil(h/f)*ceil(w/f), C) by spatial interpolation."""
    if factor == 1:
        return x
    b, _, c = x.shape
    grid = x.transpose(1, 2).reshape(b, c, h, w)
    return F.interpolate(grid, size=downsampled_size(h, w, factor), mode=mode).flatten(2).transpose(1, 2)


def nearest_indices(h: int, w: int, factor: int, mode: str, device: torch.device) -> torch.Tensor:
    """Token positions a nearest-neighbour downsampling keeps, in output order (a pure selection)."""
    index = torch.arange(h * w, device=device, dtype=torch.float32).view(1, 1, h, w)
    return F.interpolate(index, size=downsampled_size(h, w, factor), mode=mode).flatten().round().long()


def downsample_keys(k: torch.Tensor, grid: tuple[int, int], factor: int, mode: str, image_first: bool) -> torch.Tensor:
    """Downsample the image part of keys or values (B, H, S, D) whose last (or first) h*w tokens are the
    image grid; the other (text) tokens are kept as they are, in their place."""
    h, w = grid
    n = h * w
    s = k.shape[-2]
    image = k[..., :n, :] if image_first else k[..., s - n :, :]
    if mode in ("nearest", "nearest-exact"):
        reduced = image.index_select(-2, nearest_indices(h, w, factor, mode, k.device))
    else:
        b, heads, _, d = image.shape
        planes = image.transpose(-1, -2).reshape(b * heads, d, h, w)
        reduced = F.interpolate(planes, size=downsampled_size(h, w, factor), mode=mode).flatten(2).transpose(1, 2)
        reduced = reduced.reshape(b, heads, -1, d)
    if n == s:
        return reduced
    text = k[..., n:, :] if image_first else k[..., : s - n, :]
    return torch.cat([reduced, text] if image_first else [text, reduced], dim=-2)


def downsample_mask_columns(mask: torch.Tensor, grid: tuple[int, int], factor: int, mode: str, image_first: bool) -> torch.Tensor:
    """The key columns of an attention mask (..., S) that a nearest downsampling keeps."""
    h, w = grid
    n, s = h * w, mask.shape[-1]
    keep = nearest_indices(h, w, factor, mode, mask.device) + (0 if image_first else s - n)
    text = torch.arange(n, s, device=mask.device) if image_first else torch.arange(0, s - n, device=mask.device)
    columns = torch.cat([keep, text] if image_first else [text, keep])
    return mask.index_select(-1, columns)
