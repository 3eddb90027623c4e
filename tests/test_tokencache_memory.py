"""What the token cache holds, counted on the shipped Flux-style reference model run in bfloat16 as on a GPU, in units
of batch x image tokens x patched blocks x width x 2 bytes (``tokenmerge.tools.memory.cache_units``): kept exactly it
is 3.5 units (span outputs, keys and values, block inputs); the int8 default at most 2.0, ``memory="low"`` at most 1.0.
(The quality of each: docs/tokencache.md#memory, from ``tokenmerge eval`` on both seed sets.)"""

from __future__ import annotations

import warnings

import pytest

from tokenmerge.tools.memory import cache_units

pytest.importorskip("safetensors")


@pytest.mark.parametrize(("options", "low", "high"), [({"cache_dtype": None}, 3.0, 3.6), ({}, 1.5, 2.0), ({"memory": "low"}, 0.7, 1.0)])
def test_the_cache_holds_what_its_setting_promises(options, low, high):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = cache_units("flux", **options)
    assert found["blocks"] == 6 and found["batch"] == 2 and found["tokens"] == 1024
    assert low <= found["units"] <= high, found
