"""The existing families' outputs under each method, recorded from the code before the family registry (0.2.0).

``python tests/regression_cases.py`` re-records ``tests/fixtures/outputs_0_2_0.safetensors``; the test
(tests/test_regression_outputs.py) compares today's outputs with it. Small configs, fixed inputs. Flux's ``tome`` and
``tome_mlp`` entries were re-recorded (alone) when every sample of a batch got its own matching: 0.2.0 matched Flux's
batch of two on the samples' mean.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import tokenmerge
from tokenmerge.tools.architectures import build_model, transformer_inputs, unet_inputs

FIXTURE = Path(__file__).parent / "fixtures" / "outputs_0_2_0.safetensors"
METHODS = {
    "tome": dict(ratio=0.5, seed=3),
    "tome_mlp": dict(ratio=0.5, merge_mlp=True, use_rand=False),
    "todo": dict(method="todo", kv_factor=2),
    # recorded before auto had a default noise limit and factor cap (0.2.0: every step, no cap)
    "auto": dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1, auto_max_factor=None),
}
MODELS = ("sd15", "sdxl", "ldm", "sd3", "sd35", "flux", "pixart")


def build(name: str) -> torch.nn.Module:
    if name == "ldm":
        from conftest import build_ldm_unet

        return build_ldm_unet(small=True)
    return build_model(name, small=True)


def inputs(name: str, model: torch.nn.Module) -> tuple[tuple, dict]:
    if name == "ldm":
        from conftest import ldm_inputs

        return ldm_inputs(24, 16), {}
    if name in ("sd15", "sdxl"):
        return (), unet_inputs(model, 24, 16, text_tokens=7)
    return (), transformer_inputs(model, name, 18, 14, text_tokens=5)


def run(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(*args, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.sample


def outputs() -> dict[str, torch.Tensor]:
    found = {}
    for name in MODELS:
        model = build(name)
        args, kwargs = inputs(name, model)
        found[f"{name}/vanilla"] = run(model, args, kwargs)
        for method, options in METHODS.items():
            with tokenmerge.patched(model, **options):
                found[f"{name}/{method}"] = run(model, args, kwargs)
    return found


if __name__ == "__main__":
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).parent))
    FIXTURE.parent.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in outputs().items()}, str(FIXTURE))
    print(f"wrote {FIXTURE}")
