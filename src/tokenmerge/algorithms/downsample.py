"""Token downsampling (ToDo, arXiv 2402.13573): attention keys and values from a smaller copy of the token grid.

Two forms of the same operation, on grids of any rank (a :class:`~tokenmerge.algorithms.grid.TokenGrid`; one
factor per axis):

- :func:`downsample_tokens` shrinks the (B, N, C) tokens a self-attention computes its keys and values from (the
  cheapest form: the key/value projections then run on fewer tokens);
- :func:`downsample_keys` shrinks the image segment of already projected keys or values (B, H, S, D) inside a
  longer sequence of text, image and reference tokens, where the projection cannot be reached (joint attention,
  fused projections) or where positions are applied after it (rotary embeddings: reducing after them keeps
  every kept key's exact position).

Both are linear maps over tokens whose weights sum to one (nearest, (bi/tri)linear, bicubic, area), so they
commute with the projections: both forms give the same keys up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .grid import TokenGrid

_VOLUME_MODES = {"bilinear": "trilinear"}


def _mode(mode: str, rank: int) -> str:
    """The interpolation mode for a grid of ``rank`` axes (bilinear is trilinear over a video's frames)."""
    if rank == 3:
        if mode == "bicubic":
            raise ValueError("kv_interpolation='bicubic' has no 3-D form; use nearest-exact, nearest, bilinear or area on video")
        return _VOLUME_MODES.get(mode, mode)
    return mode


def downsample_tokens(x: torch.Tensor, grid: TokenGrid, factors: tuple[int, ...], mode: str) -> torch.Tensor:
    """(B, N, C) tokens of ``grid`` -> (B, prod(ceil(size / factor)), C) by interpolation over the grid."""
    if all([f == 1 for f in factors]):
        return x
    b, _, c = x.shape
    planes = x.transpose(1, 2).reshape(b, c, *grid.shape)
    return F.interpolate(planes, size=grid.reduced(factors).shape, mode=_mode(mode, grid.rank)).flatten(2).transpose(1, 2)


def nearest_indices(grid: TokenGrid, factors: tuple[int, ...], mode: str, device: torch.device) -> torch.Tensor:
    """Token positions a nearest-neighbour downsampling keeps, in output order (a pure selection)."""
    index = torch.arange(grid.numel, device=device, dtype=torch.float32).view(1, 1, *grid.shape)
    return F.interpolate(index, size=grid.reduced(factors).shape, mode=mode).flatten().round().long()


def kept_columns(length: int, start: int, grid: TokenGrid, factors: tuple[int, ...], mode: str, device: torch.device) -> torch.Tensor:
    """Positions of a sequence of ``length`` that a nearest downsampling of its image segment ``[start, start + N)``
    keeps: every other token in place, the image's kept tokens in output order."""
    keep = nearest_indices(grid, factors, mode, device) + start
    if start == 0 and grid.numel == length:
        return keep
    return torch.cat([torch.arange(start, device=device), keep, torch.arange(start + grid.numel, length, device=device)])


def downsample_keys(k: torch.Tensor, start: int, grid: TokenGrid, factors: tuple[int, ...], mode: str) -> torch.Tensor:
    """Downsample the image segment ``[start, start + N)`` of keys or values (B, H, S, D); the other tokens (text,
    reference images) are kept as they are, in their place. Nearest modes are one gather over the whole sequence
    (a single new tensor beside the full keys: video attention is often where a block's memory peaks)."""
    n, s = grid.numel, k.shape[-2]
    if mode in ("nearest", "nearest-exact"):
        return k.index_select(-2, kept_columns(s, start, grid, factors, mode, k.device))
    image = k[..., start : start + n, :]
    b, heads, _, d = image.shape
    planes = image.transpose(-1, -2).reshape(b * heads, d, *grid.shape)
    reduced = F.interpolate(planes, size=grid.reduced(factors).shape, mode=_mode(mode, grid.rank)).flatten(2).transpose(1, 2)
    reduced = reduced.reshape(b, heads, -1, d)
    if n == s:
        return reduced
    return torch.cat([k[..., :start, :], reduced, k[..., start + n :, :]], dim=-2)


def downsample_mask_columns(mask: torch.Tensor, start: int, grid: TokenGrid, factors: tuple[int, ...], mode: str) -> torch.Tensor:
    """The key columns of an attention mask (..., S) that a nearest downsampling of the image segment keeps."""
    return mask.index_select(-1, kept_columns(mask.shape[-1], start, grid, factors, mode, mask.device))


def reduce_keys_values(
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    start: int,
    grid: TokenGrid,
    factors: tuple[int, ...],
    mode: str,
    *,
    dim: int = -2,
    columns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The one key/value reduction of every route (diffusers' SDPA and dispatch backends, ComfyUI's attention
    override): the image segment ``[start, start + N)`` of keys and values downsampled by ``factors``, every other
    token (text, references) in place, and the mask's key columns with them.

    ``dim``: the sequence axis of ``key`` / ``value``: -2 for (B, H, S, D), 1 for (B, S, H * D) or (B, S, H, D)
    (interpolation acts on each channel alone, so a merged (B, S, H * D) needs no head count: keys and values with
    fewer heads than the queries, grouped-query attention, are reduced as they come). ``columns``: the positions to keep, where they
    are given (a rank's share of the whole grid's selection, under sequence parallelism); else nearest modes select
    :func:`kept_columns` and the others interpolate. ``None`` where a mask over the keys is set and ``mode`` does not
    select (an interpolated key has no column to keep): the attention then stays whole."""
    length = key.shape[dim]
    nearest = mode.startswith("nearest")
    if columns is None and nearest:
        columns = kept_columns(length, start, grid, factors, mode, key.device)
    if mask is not None and mask.shape[-1] == length:
        if columns is None:
            return None
        mask = mask.index_select(-1, columns.to(mask.device))
    if columns is not None:
        return key.index_select(dim, columns), value.index_select(dim, columns), mask

    def interpolate(t: torch.Tensor) -> torch.Tensor:
        if t.ndim == 4 and dim % 4 == 2:  # (B, H, S, D)
            return downsample_keys(t, start, grid, factors, mode)
        split = t if t.ndim == 4 else t.unsqueeze(2)  # (B, S, H, D); a merged (B, S, C) as one head of C channels
        reduced = downsample_keys(split.transpose(1, 2), start, grid, factors, mode).transpose(1, 2)
        return reduced if t.ndim == 4 else reduced.reshape(t.shape[0], -1, t.shape[-1])

    return interpolate(key), interpolate(value), mask
