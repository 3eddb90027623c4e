"""webui extension: token merging through tokenmerge instead of tomesd.

The webui keeps its own "Token merging ratio" settings (and its hires-pass ratio); this extension makes
the calls behind them go to tokenmerge, and adds tokenmerge's options to Settings > Token Merging
(tokenmerge).
"""

from modules import script_callbacks, sd_models, shared

from tokenmerge.webui import SETTINGS, WebuiTokenMerge


def _settings() -> dict:
    return {key: getattr(shared.opts, key, default) for key, default, _ in SETTINGS}


def on_ui_settings() -> None:
    section = ("tokenmerge", "Token Merging (tokenmerge)")
    for key, default, label in SETTINGS:
        shared.opts.add_option(key, shared.OptionInfo(default, label, section=section))


script_callbacks.on_ui_settings(on_ui_settings)
sd_models.tomesd = WebuiTokenMerge(_settings)
