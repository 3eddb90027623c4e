"""What the TorchFunctionModes tokenmerge enters around one attention call share."""

from __future__ import annotations

from typing import Any

import torch


def _is_tensor_method(func: Any, args: tuple) -> bool:
    return bool(args) and isinstance(args[0], torch.Tensor) and getattr(torch.Tensor, getattr(func, "__name__", ""), None) is func


def call_through(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run a torch function a mode leaves alone. Called as the tensor's own method inside a compiled graph, it is
    called as that method again: dynamo cannot trace the Python bodies of some (``Tensor.unflatten``'s ``super()``
    call, in Flux's processor), which a mode entered inside a compiled block would reach."""
    if torch.compiler.is_compiling() and _is_tensor_method(func, args):
        return getattr(args[0], func.__name__)(*args[1:], **kwargs)
    return func(*args, **kwargs)
