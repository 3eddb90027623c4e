"""A progress bar for the CLI commands (tqdm, which the diffusers extra brings), or none without tqdm."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, desc: str) -> Any | None:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)
