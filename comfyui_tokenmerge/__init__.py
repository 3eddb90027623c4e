"""ComfyUI custom-node package for tokenmerge.

Install: ``pip install tokenmerge`` into ComfyUI's Python environment, then copy or symlink this folder
into ``ComfyUI/custom_nodes/``. The node appears as "Token Merging (tokenmerge)" under model_patches/unet.
"""

from tokenmerge.comfyui import TokenMergeNode

NODE_CLASS_MAPPINGS = {"TokenMergingTokenmerge": TokenMergeNode}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenMergingTokenmerge": "Token Merging (tokenmerge)"}
