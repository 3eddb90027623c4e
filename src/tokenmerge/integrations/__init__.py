"""Front ends on top of the core: ComfyUI's patch points (``comfyui``) and the AUTOMATIC1111 / Forge webuis
(``webui``). The core never imports these modules."""
