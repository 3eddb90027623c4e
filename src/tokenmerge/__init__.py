"""tokenmerge: training-free token reduction for diffusion models: token merging (ToMe for SD), token downsampling
(ToDo) and ``auto``.

``tokenmerge.apply_patch(model, ratio=0.5)`` patches a diffusers pipeline or model of a supported family (UNets, SD3,
Flux.1/2/3, Qwen-Image, Z-Image, Wan, HunyuanVideo, LTX, ...: ``tokenmerge support`` lists them), the webui's
latent-diffusion object or an ldm/sgm UNet in place; ``tokenmerge.remove_patch(model)`` undoes it. Code written for
tomesd 0.1.3 runs unchanged after ``import tokenmerge as tomesd``.

The core (this package's top level, ``algorithms``, ``methods``, ``planning``, ``families``, ``hooks``) imports no
front end and no tool: ``tokenmerge.integrations`` (ComfyUI, webui, Forge) and ``tokenmerge.tools`` (CLI, bench,
eval, examples, reference models) sit on top.
"""

from ._version import __version__
from .config import TokenMergeConfig
from .describe import describe
from .patch import apply_patch, generation, get_config, get_configs, patched, remove_patch, update_options

__all__ = [
    "TokenMergeConfig",
    "__version__",
    "apply_patch",
    "describe",
    "generation",
    "get_config",
    "get_configs",
    "patched",
    "remove_patch",
    "update_options",
]
