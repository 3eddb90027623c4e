"""Pure tensor algorithms, no model knowledge: token grids and sequence layouts (``grid``), matching and merging
(``merge``), token downsampling (``downsample``), the device-independent random partition (``randomness``) and one
rank's part of a sequence split across ranks (``shards``)."""

from .downsample import downsample_keys, downsample_mask_columns, downsample_tokens, kept_columns, nearest_indices, reduce_keys_values
from .grid import Segment, TokenGrid, TokenLayout, kept_positions, take_rows
from .merge import (
    AROUND_BLOCK,
    MergePlan,
    TokenSpan,
    batch_metric,
    best_destinations,
    bipartite_soft_matching,
    grid_partition,
    restore_residual,
)
from .randomness import fold_seed, hash32, hash_ints, random_offsets, timestep_keys
from .shards import Shard, box_of, chunk_bounds, shard_layout

__all__ = [
    "AROUND_BLOCK",
    "MergePlan",
    "Segment",
    "Shard",
    "TokenGrid",
    "TokenLayout",
    "TokenSpan",
    "batch_metric",
    "best_destinations",
    "bipartite_soft_matching",
    "box_of",
    "chunk_bounds",
    "downsample_keys",
    "downsample_mask_columns",
    "downsample_tokens",
    "fold_seed",
    "grid_partition",
    "hash32",
    "hash_ints",
    "kept_columns",
    "kept_positions",
    "nearest_indices",
    "random_offsets",
    "reduce_keys_values",
    "restore_residual",
    "shard_layout",
    "take_rows",
    "timestep_keys",
]
