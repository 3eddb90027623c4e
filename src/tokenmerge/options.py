"""An option, declared once: its name, default, check and one-line help, from which the config's validation, every
front end's widget (the ComfyUI node, the webui settings), the CLI's variant syntax and docs/options.md are made.

Options every method reads are declared here (:data:`COMMON`); the others by the method that reads them first
(``Method.options`` in :mod:`tokenmerge.methods`). Every error names the option and the values it accepts; numbers
are accepted as drop-in code passes them (Python, NumPy or 0-d tensor scalars), booleans and strings are not numbers.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

# What an option holds: a number in a range ("real", "int"), True or False ("bool"), one of ``choices`` ("choice";
# "dtype" also takes the torch dtypes of those names), any int ("seed"), a power of two ("power2"), or an int or a
# (t, h, w) triple of ints ("factor").
KINDS = ("real", "int", "bool", "choice", "dtype", "seed", "power2", "factor")


def _scalar(value: Any) -> Any:
    """A 0-d tensor's Python value; anything else unchanged."""
    if type(value).__name__ == "Tensor" and getattr(value, "ndim", None) == 0 and not value.dtype.is_complex:
        return value.item()
    return value


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


@dataclass(frozen=True)
class Option:
    """One option. ``low``/``high``: a number's bounds (``open``: which of them are excluded, "low", "high" or
    "both"); ``none``: what None means where it is accepted (a widget shows it as ``none_word`` among the choices, or
    as ``widget_none`` for a number, 0 unless 0 is a value of its own); ``advanced``:
    a front end may fold it away (the ComfyUI node makes it an optional input); ``widget_max``: a slider's end where
    the range is open; ``doc``: more than the one-line ``help`` (docs/options.md, the config's docstring)."""

    name: str
    kind: str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    open: str = ""
    choices: tuple[str, ...] = ()
    none: str | None = None
    none_word: str | None = None
    advanced: bool = True
    widget_max: float | None = None
    step: float | None = None
    doc: str = ""
    widget_none: float = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def allowed(self) -> str:
        """The values it accepts, as an error message says them."""
        if self.kind in ("real", "int"):
            what = "a number" if self.kind == "real" else "an int"
            if self.low is not None and self.high is not None:
                lo = "(" if self.open in ("low", "both") else "["
                hi = ")" if self.open in ("high", "both") else "]"
                text = f"{what} in {lo}{_num(self.low)}, {_num(self.high)}{hi}"
            elif self.low is not None:
                text = f"{what} {'>' if self.open == 'low' else '>='} {_num(self.low)}"
            else:
                text = what
        elif self.kind == "bool":
            text = "True or False"
        elif self.kind in ("choice", "dtype"):
            text = ", ".join(self.choices) + (" (or the torch dtypes of those names)" if self.kind == "dtype" else "")
            text = text if self.none is not None else f"one of {text}"
        elif self.kind == "seed":
            text = "an int"
        elif self.kind == "power2":
            text = "a power of two such as 1, 2, 4 or 8"
        else:
            text = "an int >= 1 or a (t, h, w) tuple of ints >= 1"
        if self.none is not None:
            text = f"None ({self.none_word}) or {text}" if self.kind == "power2" else f"None or {text}"
        return text

    def check(self, value: Any) -> Any:
        """``value`` normalised (a Python number, a dtype's name), or a TypeError / ValueError naming the option and
        what it accepts."""
        if value is None and self.none is not None:
            return None
        value = _scalar(value)
        kind = self.kind
        if kind == "bool":
            if not _is_bool(value):
                raise TypeError(f"{self.name} must be {self.allowed}, got {value!r}")
            return bool(value)
        if kind in ("choice", "dtype"):
            if kind == "dtype" and type(value).__name__ == "dtype":
                value = str(value).removeprefix("torch.")
            if value not in self.choices:
                raise ValueError(f"{self.name} must be {self.allowed}, got {value!r}")
            return value
        if kind == "factor":
            return self._factor(value)
        number = self._number(value, int if kind in ("int", "seed", "power2") else float)
        if kind == "power2" and (number < 1 or number & (number - 1)):
            raise ValueError(f"{self.name} must be {self.allowed}, got {number!r}")
        if kind in ("real", "int") and not self._in_range(number):
            raise ValueError(f"{self.name} must be {self.allowed}, got {value!r}")
        return number

    def _number(self, value: Any, kind: type) -> Any:
        wanted = numbers.Integral if kind is int else numbers.Real
        if _is_bool(value) or not isinstance(value, wanted):
            raise TypeError(f"{self.name} must be {self.allowed}, got {value!r}")
        return kind(value)

    def _in_range(self, number: float) -> bool:
        if isinstance(number, float) and math.isnan(number):
            return False
        low_open, high_open = self.open in ("low", "both"), self.open in ("high", "both")
        if self.low is not None and (number < self.low or (low_open and number == self.low)):
            return False
        return not (self.high is not None and (number > self.high or (high_open and number == self.high)))

    def _factor(self, value: Any) -> int | tuple[int, int, int]:
        items = value if isinstance(value, (tuple, list)) else (value,)
        if isinstance(value, (tuple, list)) and len(value) != 3:
            raise ValueError(f"{self.name} must be {self.allowed}, got {value!r}")
        factors = tuple(self._number(_scalar(v), int) for v in items)
        if min(factors) < 1:
            raise ValueError(f"{self.name} must be {self.allowed}, got {value!r}")
        return factors[0] if len(factors) == 1 else factors

    # ----- as a front end's widget (the ComfyUI node, the webui settings): numbers, checkboxes or words -----

    @property
    def words(self) -> tuple[str, ...] | None:
        """The words a widget offers (None: a number or a checkbox); None's word first where None is accepted."""
        if self.kind in ("choice", "dtype"):
            return ((self.none_word,) if self.none is not None else ()) + self.choices
        if self.kind == "power2":
            return (self.none_word or "auto", "1", "2", "4", "8")
        if self.kind == "bool" and self.none is not None:
            return (self.none_word or "auto", "on", "off")
        return None

    @property
    def widget_help(self) -> str:
        """``help`` with what a widget's None stands for (its word, or 0), as the front ends label it."""
        if self.none is None or self.kind == "seed":  # (a seed's None is 0 itself)
            return self.help
        return f"{self.help} ({self.words[0] if self.words else _num(self.widget_none)}: {self.none})"

    @property
    def widget_default(self) -> Any:
        """The default as the widget shows it (None: its word, or ``widget_none`` for a number)."""
        if self.words is not None:
            if self.default is None:
                return self.words[0]
            return ("on" if self.default else "off") if self.kind == "bool" else str(self.default)
        return self.widget_none if self.default is None else self.default

    @property
    def widget_range(self) -> tuple[float, float]:
        """A number widget's (min, max): ``widget_none`` where it stands for None (outside the option's range), an
        excluded bound moved in by a step."""
        step = self.step or 1
        low = self.widget_none if self.none is not None else 0 if self.kind == "seed" else (self.low if self.low is not None else 0)
        if self.none is None and self.open in ("low", "both"):
            low = low + step
        high = self.widget_max if self.widget_max is not None else self.high if self.high is not None else 2**63 - 1
        return low, high

    def from_widget(self, value: Any) -> Any:
        """A widget's value as the option takes it (checked by the config)."""
        if self.words is not None:
            if self.none is not None and value == self.words[0]:
                return None
            if self.kind == "power2":
                return int(value) if str(value).isdigit() else value
            return {"on": True, "off": False}.get(value, value) if self.kind == "bool" else value
        if self.none is not None and value == self.widget_none:
            return None
        if self.kind in ("int", "seed", "factor") and isinstance(value, float) and value.is_integer():
            return int(value)  # (gradio's Number gives floats)
        return value

    @property
    def annotation(self) -> str:
        """Its type, as the config's field annotation says it."""
        base = {
            "real": "float",
            "int": "int",
            "bool": "bool",
            "choice": "str",
            "dtype": "str",
            "seed": "int",
            "power2": "int",
            "factor": "int | tuple[int, int, int]",
        }[self.kind]
        return f"{base} | None" if self.none is not None else base


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


COMMON: tuple[Option, ...] = (
    Option(
        "method",
        "choice",
        "tome",
        "how blocks are reduced",
        choices=(),  # the registry's methods and what each does (tokenmerge.methods), set there
        advanced=False,
    ),
    Option(
        "max_downsample",
        "power2",
        None,
        "reduce only in blocks whose latent is downsampled at most this much (UNets)",
        none="the highest-resolution level with attention",
        none_word="auto",
        advanced=False,
        doc="That is 1 on SD 1.x/2.x and 2 on SDXL (whose top level has no attention, so tomesd's default of 1 does "
        "nothing there); transformers have one level: any value other than None is rejected there.",
    ),
    Option(
        "max_noise",
        "real",
        None,
        "reduce only in the steps whose noise level is at most this (1 = pure noise: every step)",
        low=0,
        high=1,
        open="low",
        none="the method's own: auto 0.4, the others 1",
        advanced=False,
        step=0.05,
        doc="The timestep as a fraction of the model's range (1 = pure noise, 0 = clean); the noisier steps run unchanged. "
        "A reduction in the high-noise steps moves the whole image's layout, one in the low-noise steps only its detail: "
        "on the reference models auto at 0.4 keeps more than ToMe r=0.5 on every yardstick (docs/quality.md). Read once "
        "per call; under torch.compile of the whole denoiser it cannot be read and every step is reduced (compile the "
        "blocks to keep it).",
    ),
    Option(
        "merge_attn",
        "bool",
        True,
        "run attention on the reduced tokens (ToMe; a transformer's joint attention, Flux's parallel blocks)",
    ),
)
