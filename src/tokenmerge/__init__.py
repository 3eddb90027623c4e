"""tokenmerge: training-free Token Merging (ToMe for SD) for Stable Diffusion.

``tokenmerge.apply_patch(model, ratio=0.5)`` patches a diffusers pipeline or model, the webui's
latent-diffusion object or an ldm/sgm UNet in place; ``tokenmerge.remove_patch(model)`` undoes it.
Code written for tomesd 0.1.3 runs unchanged after ``import tokenmerge as tomesd``.
"""

from .config import TokenMergeConfig
from .patching import apply_patch, get_config, remove_patch, update_options

__version__ = "0.1.0"
__all__ = ["TokenMergeConfig", "apply_patch", "get_config", "remove_patch", "update_options", "__version__"]
