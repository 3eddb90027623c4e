"""Token rows kept across steps in less memory: as they are, cast to another float dtype, or as int8 with a scale per
group of values (the way LLM servers keep key/value caches: per token, per group of a row's channels, so that one
outlier channel spoils only its group).

A store holds a tensor whose rows lie along one axis (``dim``); a step writes the rows it recomputed and reads the
whole tensor back with those rows exact (:meth:`RowStore.with_rows`), the others as stored.
"""

from __future__ import annotations

import math

import torch

GROUP = 64  # values per int8 scale along the last axis (fewer where the last axis is not a multiple of it)
GROUP4 = 128  # values per int4 scale (a head's keys in most models)
_TINY, _HUGE = 2.0**-24, 65504.0  # float16's smallest and largest scale
CACHE_DTYPES = ("int8", "int4", "bfloat16", "float16", "float32")  # cache_dtype's names (None: the model's own dtype)


class RowStore:
    """Rows of a tensor kept as they are or cast to ``dtype`` (a float dtype)."""

    def __init__(self, x: torch.Tensor, dtype: torch.dtype | None = None, copy: bool = True) -> None:
        # (a copy keeps the strides of a view, a (B, H, S, D) view of a (B, S, H, D) tensor: its caller's layout)
        self.data = x.detach().to(dtype or x.dtype, copy=copy)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def exact(self, dtype: torch.dtype) -> bool:
        """Whether rows of ``dtype`` are kept without loss (then :meth:`with_rows` hands back the store itself)."""
        return self.data.dtype == dtype

    def thaw(self) -> None:
        """Make it writable where it was made under ``torch.inference_mode`` and this call runs outside it (a
        generation whose calls mix the two: copied once)."""
        for name, t in vars(self).items():
            if isinstance(t, torch.Tensor) and t.is_inference() and not torch.is_inference_mode_enabled():
                setattr(self, name, t.clone())

    def write(self, dim: int, index: torch.Tensor, rows: torch.Tensor) -> None:
        """Keep ``rows`` at ``index`` (broadcast as ``Tensor.scatter_`` takes it) along ``dim``."""
        self.data.scatter_(dim, index, rows.detach().to(self.data.dtype))

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        """Every row, in ``dtype``."""
        return self.data if self.data.dtype == dtype else self.data.to(dtype)

    def rows(self, dim: int, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows at ``index`` (as ``Tensor.gather`` takes it) along ``dim``, in ``dtype``."""
        return self.data.gather(dim, index).to(dtype)

    def with_rows(self, dim: int, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Keep ``rows`` and return every row in ``rows``' dtype, those exact (the others as stored). Where the store is
        exact, the returned tensor is the store itself, written in place (read it before the next write)."""
        self.write(dim, index, rows)
        if self.exact(rows.dtype):
            return self.data
        return self.read(rows.dtype).scatter_(dim, index, rows.detach())


class Int8Store(RowStore):
    """Rows kept as int8, with a float16 scale (its largest magnitude / 127) per group of :data:`GROUP` values of a
    row's last axis: a little over half the bytes of bfloat16."""

    LEVELS = 127  # the largest magnitude a value takes
    GROUP = GROUP

    def __init__(self, x: torch.Tensor) -> None:
        self.group = math.gcd(x.shape[-1], self.GROUP)
        self.values, self.scales = self._quantise(x.detach())

    def _quantise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grouped = x.float().unflatten(-1, (-1, self.group))
        # float16 scales (their own rounding taken into the values); a group beyond float16's range saturates
        scales = (grouped.abs().amax(-1, keepdim=True) / self.LEVELS).clamp_(_TINY, _HUGE).to(torch.float16)
        values = (grouped / scales.float()).round_().clamp_(-self.LEVELS, self.LEVELS).to(torch.int8)
        return self._pack(values.flatten(-2)), scales.squeeze(-1)

    def _pack(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def _unpack(self, values: torch.Tensor) -> torch.Tensor:
        return values

    @property
    def nbytes(self) -> int:
        return self.values.numel() + self.scales.numel() * self.scales.element_size()

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    def exact(self, dtype: torch.dtype) -> bool:
        return False

    def write(self, dim: int, index: torch.Tensor, rows: torch.Tensor) -> None:
        if dim % self.values.ndim == self.values.ndim - 1:
            raise ValueError(f"an {type(self).__name__} keeps rows along an axis other than its last (the grouped one)")
        values, scales = self._quantise(rows)  # (the index is constant along the last axis: its first columns serve)
        self.values.scatter_(dim, index[..., : values.shape[-1]], values)
        self.scales.scatter_(dim, index[..., : scales.shape[-1]], scales)

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        return self._dequantise(self.values, self.scales, dtype)

    def rows(self, dim: int, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        first = index.narrow(-1, 0, 1)  # (the index is constant along the last axis)
        values = self.values.gather(dim, first.expand(*index.shape[:-1], self.values.shape[-1]))
        scales = self.scales.gather(dim, first.expand(*index.shape[:-1], self.scales.shape[-1]))
        return self._dequantise(values, scales, dtype)

    def _dequantise(self, values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        grouped = self._unpack(values).unflatten(-1, (-1, self.group)).to(torch.float32) * scales.unsqueeze(-1)
        return grouped.flatten(-2).to(dtype)


class Int4Store(Int8Store):
    """Rows kept as 4-bit values (-7..7), two to a byte, with a float16 scale per group of :data:`GROUP4` values:
    a little over a quarter of bfloat16's bytes. Rows of an odd length along the last axis are kept as int8."""

    LEVELS = 7
    GROUP = GROUP4

    def _pack(self, values: torch.Tensor) -> torch.Tensor:
        nibbles = (values + 8).to(torch.uint8).unflatten(-1, (-1, 2))
        return nibbles[..., 0] | (nibbles[..., 1] << 4)

    def _unpack(self, values: torch.Tensor) -> torch.Tensor:
        return torch.stack([values & 15, values >> 4], dim=-1).flatten(-2).to(torch.int8) - 8


def store(x: torch.Tensor, cache_dtype: str | None) -> RowStore:
    """``x`` kept as ``cache_dtype`` says (:data:`CACHE_DTYPES`; None: as it is)."""
    if cache_dtype == "int4" and x.shape[-1] % 2 == 0:
        return Int4Store(x)
    if cache_dtype in ("int8", "int4"):
        return Int8Store(x)
    return RowStore(x, None if cache_dtype is None else getattr(torch, cache_dtype))
