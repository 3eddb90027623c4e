"""Plain PyTorch hooks that carry out each block's action around the unchanged upstream forwards.

- ``state``: what is fixed per patch and what belongs to one call (per thread; replayed in backward);
- ``calls``: open/close a call, capture token grids, decide each block's action;
- ``tokens``: the span protocol: gather the image tokens a span runs on as it is entered (merged ones, or a
  selection), scatter its output back as it is left;
- ``attention``: reduce an attention's image keys/values or, in a span that fills keys, give it every token's, by
  keyword or at the SDPA / dispatch call;
- ``install``: attach all of them from a denoiser's layout (its family's), and remove them.
"""

from .install import STATE_ATTR, install, states_in, states_of, uninstall
from .state import PatchState

__all__ = ["STATE_ATTR", "PatchState", "install", "states_in", "states_of", "uninstall"]
