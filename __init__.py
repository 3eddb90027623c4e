"""ComfyUI custom-node package: this repository cloned into ``ComfyUI/custom_nodes/``.

ComfyUI imports this file as a package; it makes the repository's own ``src/tokenmerge`` importable (no pip
step: tokenmerge needs nothing but the torch ComfyUI already has) and registers the node
"Token Merging (tokenmerge)" under model_patches/unet.
"""

import os
import sys

_SRC = os.path.join(os.path.dirname(os.path.realpath(__file__)), "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from tokenmerge.integrations.comfyui import TokenMergeNode  # noqa: E402

NODE_CLASS_MAPPINGS = {"TokenMergingTokenmerge": TokenMergeNode}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenMergingTokenmerge": "Token Merging (tokenmerge)"}
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
