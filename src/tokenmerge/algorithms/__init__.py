"""Pure tensor algorithms, no model knowledge: token grids and sequence layouts (``grid``), matching and merging
(``merge``), token downsampling (``downsample``) and the device-independent random partition (``randomness``)."""

from .downsample import downsample_keys, downsample_mask_columns, downsample_tokens, nearest_indices
from .grid import Segment, TokenGrid, TokenLayout
from .merge import MergePlan, batch_metric, best_destinations, bipartite_soft_matching, grid_partition
from .randomness import fold_seed, hash32, hash_ints, random_offsets, timestep_keys

__all__ = [
    "MergePlan",
    "Segment",
    "TokenGrid",
    "TokenLayout",
    "batch_metric",
    "best_destinations",
    "bipartite_soft_matching",
    "downsample_keys",
    "downsample_mask_columns",
    "downsample_tokens",
    "fold_seed",
    "grid_partition",
    "hash32",
    "hash_ints",
    "nearest_indices",
    "random_offsets",
    "timestep_keys",
]
