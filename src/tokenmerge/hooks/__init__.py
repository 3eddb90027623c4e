"""Plain PyTorch hooks that carry out each block's action around the unchanged upstream forwards.

- ``state``: what is fixed per patch and what belongs to one call (per thread; replayed in backward);
- ``calls``: open/close a call, capture token grids, decide each block's action;
- ``tokens``: merge image tokens on entering a span, restore them on leaving it (ToMe);
- ``attention``: downsample image keys/values (ToDo), by keyword or at the SDPA call;
- ``install``: attach all of them from a denoiser's layout (its family's), and remove them.
"""

from .install import STATE_ATTR, install, states_in, states_of, uninstall
from .state import PatchState

__all__ = ["STATE_ATTR", "PatchState", "install", "states_in", "states_of", "uninstall"]
