"""AUTOMATIC1111 / Forge webui script of the tokenmerge extension (this repository, cloned into extensions/).

The webui runs every ``scripts/*.py`` at the extension's root; this one makes the repository's own
``src/tokenmerge`` importable (no pip step) and routes the webui's token merging through it.
"""

import os
import sys

_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:
    sys.path.insert(0, _SRC)

import gradio as gr  # noqa: E402
from modules import script_callbacks, sd_models, shared  # noqa: E402

from tokenmerge.integrations.webui import install  # noqa: E402

install(shared=shared, script_callbacks=script_callbacks, sd_models=sd_models, gradio=gr)
