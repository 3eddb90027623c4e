"""ComfyUI: the node "Token Merging (tokenmerge)" and the routes it patches a MODEL through, all on ComfyUI's own patch
points (no ComfyUI code is copied or patched, nothing of ComfyUI is imported here).

- :mod:`.node`: the node, its inputs made from the options' declarations;
- :mod:`.route`: which route a MODEL takes (:func:`patch_model`, also what Forge's UNet patcher calls);
- :mod:`.unet`: UNets (SD 1.x, 2.x, XL) through the attention patch points;
- :mod:`.dit`: diffusion transformers' keys and values through the attention override;
- :mod:`.blocks`: the methods whose spans run on gathered tokens, around diffusion transformers' blocks (their
  replace patches);
- :mod:`.shared`: a step's noise level, the schedule's, and the patch object a MODEL and its clones share.

Imports run one way (node -> route -> blocks -> dit -> shared; route -> unet -> shared). The repository's root
``__init__.py`` exposes :class:`TokenMergeNode`.
"""

from .node import OPTIONAL, REQUIRED, TokenMergeNode, node_input
from .route import COMFY_METHODS, patch_dit, patch_model
from .shared import SharedPatch, comfy_levels, comfy_noise, comfy_step, model_sampling_of
from .unet import ComfyTokenMerge, patch_unet, token_grid, top_attention_level

__all__ = [
    "COMFY_METHODS",
    "OPTIONAL",
    "REQUIRED",
    "ComfyTokenMerge",
    "SharedPatch",
    "TokenMergeNode",
    "comfy_levels",
    "comfy_noise",
    "comfy_step",
    "model_sampling_of",
    "node_input",
    "patch_dit",
    "patch_model",
    "patch_unet",
    "token_grid",
    "top_attention_level",
]
