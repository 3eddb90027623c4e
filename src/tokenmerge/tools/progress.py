"""A progress bar for the CLI commands (tqdm, which the diffusers extra brings), or none without tqdm."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

PAUSE_VARIABLE = "TOKENMERGE_BENCH_PAUSE"


def progress_bar(total: int, desc: str) -> Any | None:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)


def wait_while_paused() -> None:
    """Between two timed forwards, wait while the file named by ``$TOKENMERGE_BENCH_PAUSE`` exists, with
    ``<file>.held`` present while waiting: a developer can then run something else on the machine without it
    landing inside a measurement (on 2 shared cores, anything else running skews the timings)."""
    name = os.environ.get(PAUSE_VARIABLE)
    if not name or not Path(name).exists():
        return
    held = Path(f"{name}.held")
    held.touch()
    try:
        while Path(name).exists():
            time.sleep(2)
    finally:
        held.unlink(missing_ok=True)
