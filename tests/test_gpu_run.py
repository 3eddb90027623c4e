"""The prepared GPU run (``tokenmerge gpu-run``), checked on the CPU at tiny sizes: every model, variant and
compilation runs, is timed, and what tokenmerge says is recorded (the token cache, eager or compiled, says nothing)."""

from __future__ import annotations

import json

from tokenmerge.tools.cli import main
from tokenmerge.tools.gpu_run import VARIANTS


def test_the_gpu_run_runs_every_variant_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["gpu-run", "--tiny", "--steps", "4", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    rows = {(r["model"], r["variant"], r["compiled"]): r for r in found["rows"]}
    assert set(rows) == {(m, v, c) for m in ("flux", "wan") for v in VARIANTS for c in (False, True)}
    assert all(r["seconds"] > 0 and r["peak_bytes"] is None and r["syncs_per_step"] is None for r in rows.values())
    assert not rows[("flux", "tokencache", True)]["said"] and not rows[("flux", "tokencache", False)]["said"]
    assert "wrote" in capsys.readouterr().out
