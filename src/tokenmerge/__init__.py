"""tokenmerge: training-free token merging (ToMe for SD) and token downsampling (ToDo) for diffusion models.

``tokenmerge.apply_patch(model, ratio=0.5)`` patches a diffusers pipeline or model (UNets, SD3, Flux, PixArt),
the webui's latent-diffusion object or an ldm/sgm UNet in place; ``tokenmerge.remove_patch(model)`` undoes
it. Code written for tomesd 0.1.3 runs unchanged after ``import tokenmerge as tomesd``.

The core (this package's top level, ``algorithms``, ``planning``, ``families``, ``hooks``) imports no front
end and no tool: ``tokenmerge.integrations`` (ComfyUI, webui, Forge) and ``tokenmerge.tools`` (CLI, bench,
eval, reference models) sit on top.
"""

from ._version import __version__
from .config import TokenMergeConfig
from .describe import describe
from .patch import apply_patch, get_config, get_configs, patched, remove_patch, update_options

__all__ = [
    "TokenMergeConfig",
    "__version__",
    "apply_patch",
    "describe",
    "get_config",
    "get_configs",
    "patched",
    "remove_patch",
    "update_options",
]
