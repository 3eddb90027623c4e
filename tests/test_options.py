"""Options declared once (tokenmerge.options, each method's ``options``): the config, the ComfyUI node, the webui
settings and docs/options.md are made from the declarations, and every option reaches every front end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tokenmerge import TokenMergeConfig
from tokenmerge.config import DEFAULTS, OPTION_NAMES, TOMESD_PARAMETERS, ignored_by
from tokenmerge.integrations.comfyui import OPTIONAL, REQUIRED, TokenMergeNode
from tokenmerge.integrations.webui import SETTINGS, WEBUI_DEFAULTS, options_from
from tokenmerge.methods import OPTIONS, OWNERS, REGISTRY
from tokenmerge.tools.options_table import block

ROOT = Path(__file__).parents[1]


def test_the_config_is_made_from_the_declarations():
    fields = dataclasses.fields(TokenMergeConfig)
    assert tuple(f.name for f in fields) == OPTION_NAMES
    assert OPTION_NAMES[: len(TOMESD_PARAMETERS)] == TOMESD_PARAMETERS  # tomesd's positional order
    assert {f.name: f.default for f in fields} == {name: o.default for name, o in OPTIONS.items()}
    assert set(OPTIONS) == set(OPTION_NAMES)
    for name in OPTION_NAMES:
        assert name in TokenMergeConfig.__doc__


def test_each_method_reads_its_own_options_and_what_it_borrows():
    for method in REGISTRY.values():
        own = {o.name for o in method.options}
        assert own <= set(method.reads)
        assert set(method.reads) <= set(OPTIONS)
        assert all(OWNERS[name] == method.name for name in own)
        assert not own & set(ignored_by(method.name))


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_every_option_is_an_input_of_the_comfyui_node_and_a_webui_setting(name):
    inputs = TokenMergeNode.INPUT_TYPES()
    assert name in inputs["required"] or name in inputs["optional"]
    assert (name in inputs["optional"]) == OPTIONS[name].advanced  # advanced options are optional inputs
    settings = {s.option for s in SETTINGS}
    assert name in settings or name == "ratio"  # the webui's own slider sets ratio


def test_the_node_keeps_the_widget_order_saved_workflows_hold():
    # widgets_values are positional: the first node's inputs, then tokencache's, then the others appended
    assert REQUIRED == (
        "ratio", "max_downsample", "sx", "sy", "use_rand", "seed", "merge_crossattn", "method", "kv_factor", "kv_interpolation", "max_noise"
    )  # fmt: skip
    assert OPTIONAL[:5] == ("recompute", "refresh_every", "full_steps", "cache_dtype", "memory")
    inputs = TokenMergeNode.INPUT_TYPES()
    assert list(inputs["required"]) == ["model", *REQUIRED] and list(inputs["optional"]) == list(OPTIONAL)


def test_widget_defaults_give_the_defaults_in_every_front_end():
    inputs = TokenMergeNode.INPUT_TYPES()
    values = {name: info[1]["default"] for part in ("required", "optional") for name, info in inputs[part].items() if name != "model"}
    assert TokenMergeConfig(**{name: OPTIONS[name].from_widget(v) for name, v in values.items()}) == DEFAULTS
    webui = TokenMergeConfig(**options_from({}))
    assert webui == DEFAULTS.replace(**WEBUI_DEFAULTS)


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_every_widget_value_is_accepted_and_none_has_a_word_or_its_number(name):
    option = OPTIONS[name]
    if option.words is not None:
        for word in option.words:
            TokenMergeConfig(**{name: option.from_widget(word)})  # every offered choice is valid
        if option.none is not None:
            assert option.from_widget(option.words[0]) is None
    elif option.kind not in ("bool",):
        low, high = option.widget_range
        for value in (low, high):
            converted = option.from_widget(value)
            if name == "max_noise" or (option.none is not None and value == option.widget_none):
                continue
            TokenMergeConfig(**{name: converted})
        if option.none is not None:  # 0, or -1 where 0 is a value of its own (full_steps=0: no full step first)
            assert option.from_widget(option.widget_none) is None
            assert option.widget_none == 0 or option.check(0) == 0


@pytest.mark.parametrize("name", [n for n in OPTION_NAMES if OPTIONS[n].kind in ("real", "int")])
def test_out_of_range_values_name_the_option_and_what_it_accepts(name):
    option = OPTIONS[name]
    bad = (option.low - 1) if option.low is not None else (option.high + 1)
    with pytest.raises(ValueError, match=f"^{name} must be {option.allowed.replace('(', '.').replace(')', '.').replace('[', '.')}"):
        TokenMergeConfig(**{name: bad})
    with pytest.raises(TypeError, match=f"^{name} must be"):
        TokenMergeConfig(**{name: "1"})


def test_docs_options_table_is_the_declarations():
    text = (ROOT / "docs" / "options.md").read_text()
    assert block() in text, "run: tokenmerge options --write-docs docs/options.md"
