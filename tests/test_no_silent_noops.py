"""Options that cannot act are said once, with the effective value (never a silent no-op)."""

from __future__ import annotations

import warnings

import pytest
import torch

import tokenmerge

from conftest import sd_inputs


def _messages(caught) -> list[str]:
    return [str(w.message) for w in caught if "tokenmerge" in str(w.message)]


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("options", [dict(sx=64, sy=64), dict(sx=41, sy=1)], ids=["64x64 window", "41x1 window"])
def test_a_window_larger_than_the_grid_is_said_once(sd15_small, options):
    inputs = sd_inputs(sd15_small, 16, 16)
    vanilla = _run(sd15_small, inputs)
    with tokenmerge.patched(sd15_small, ratio=0.5, **options), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _run(sd15_small, inputs)
        _run(sd15_small, inputs)
    assert torch.equal(out, vanilla)
    found = [m for m in _messages(caught) if "destination window" in m]
    assert found and all("effective ratio 0" in m for m in found)
    assert len(found) == 1  # once per patch and cause, not per block or per call


def test_a_one_row_grid_says_it_merges_nothing(sd15_small):
    inputs = sd_inputs(sd15_small, 8, 64)  # 8 x 64 latent: 1 x 8 tokens at the deepest attention level
    with tokenmerge.patched(sd15_small, ratio=0.5, max_downsample=8), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(sd15_small, inputs)
    assert any("1x8 token grid holds no whole" in m for m in _messages(caught))


def test_a_key_value_factor_beyond_the_grid_says_what_is_left(sd15_small):
    inputs = sd_inputs(sd15_small, 16, 16)
    with tokenmerge.patched(sd15_small, method="todo", kv_factor=64), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(sd15_small, inputs)
    assert any("key/value factor 64 exceeds a side of its 16x16 token grid: its 256 keys become 1 (1x1)" in m for m in _messages(caught))


@pytest.mark.parametrize(
    "options,ignored",
    [
        (dict(method="tome", kv_factor=4), "method='tome' does not use kv_factor=4"),
        (dict(method="todo", ratio=0.3, sx=4), "method='todo' does not use ratio=0.3, sx=4"),
        (dict(method="auto", kv_factor=3), "method='auto' does not use kv_factor=3"),
        (dict(method="todo", auto_max_keys=128), "method='todo' does not use auto_max_keys=128"),
    ],
)
def test_options_the_method_does_not_use_are_said(sd15_small, options, ignored):
    with pytest.warns(UserWarning, match=ignored.replace("(", r"\(").replace(")", r"\)")):
        tokenmerge.apply_patch(sd15_small, **options)
    tokenmerge.remove_patch(sd15_small)


def test_options_at_their_defaults_say_nothing(sd15_small):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenmerge.apply_patch(sd15_small, method="todo", kv_factor=3)
        tokenmerge.apply_patch(sd15_small, ratio=0.4, sx=2)
    tokenmerge.remove_patch(sd15_small)
    assert not _messages(caught)


def test_describe_tells_unsupported_from_unpatched(sd15_small):
    assert str(tokenmerge.describe(sd15_small)) == "not patched by tokenmerge"
    text = str(tokenmerge.describe(torch.nn.Linear(2, 2)))
    assert text.startswith("not supported by tokenmerge: Linear: no supported model family")


def test_pipeline_messages_name_the_components():
    from diffusers import DDIMScheduler, DiffusionPipeline

    class OnlyScheduler(DiffusionPipeline):
        def __init__(self, scheduler):
            super().__init__()
            self.register_modules(scheduler=scheduler)

    with pytest.raises(TypeError, match=r"OnlyScheduler holds no model to patch \(its components: scheduler \(DDIMScheduler\)\)"):
        tokenmerge.apply_patch(OnlyScheduler(DDIMScheduler()))

    class WithLinear(DiffusionPipeline):
        def __init__(self, transformer):
            super().__init__()
            self.register_modules(transformer=transformer)

    with pytest.raises(TypeError, match=r"WithLinear's transformer \(Linear\): no supported model family.*Flux\.1, "):
        tokenmerge.apply_patch(WithLinear(torch.nn.Linear(2, 2)))


def test_auto_leaving_every_block_alone_says_so_once():
    from tokenmerge.tools.architectures import build_model, transformer_inputs

    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 16, 16, text_tokens=5)  # 8x8 tokens: far below auto_min_tokens
    with tokenmerge.patched(model, method="auto"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.no_grad():
                model(**inputs)
    found = [m for m in _messages(caught) if "leaves every block" in m]
    assert found == [
        "tokenmerge: FluxTransformer2DModel: method='auto' leaves every block unchanged at this size: its largest "
        "token grid, 8x8 = 64 tokens, is at most auto_min_tokens=1024, where attention is cheap next to the rest (no "
        "speed-up, by design). For a speed-up at this size use method='tome' or 'todo', or a lower auto_min_tokens"
    ]


def test_warnings_while_a_model_runs_point_at_the_line_that_ran_it(sd15_small):
    """A notice raised by a hook inside torch's and diffusers' call stack is attributed to the user's line (here,
    ``_run``'s), not to the hook: the depth between the two varies, so no fixed stacklevel could."""
    inputs = sd_inputs(sd15_small, 16, 16)  # a small grid: auto leaves every block alone, and says so once
    with tokenmerge.patched(sd15_small, method="auto"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(sd15_small, inputs)
    found = [w for w in caught if "leaves every block" in str(w.message)]
    assert len(found) == 1 and found[0].filename == __file__, [(w.filename, w.lineno) for w in found]


def test_a_patchs_warnings_point_at_the_line_that_patched(sd15_small):
    """Called directly or through ``patched()``'s context manager, apply_patch's warnings name the caller's line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenmerge.apply_patch(sd15_small, method="todo", seed=3)
        tokenmerge.remove_patch(sd15_small)
        with tokenmerge.patched(sd15_small, method="todo", seed=3):
            pass
    found = [w for w in caught if "does not use seed=3" in str(w.message)]
    assert len(found) == 2 and all(w.filename == __file__ for w in found), [(w.filename, w.lineno) for w in found]


def test_a_call_the_noise_gate_leaves_whole_is_said_once_per_patch():
    """auto's default reduces only the steps at noise <= 0.4: a call above it runs whole, said once (its noise level,
    max_noise, how to change it), not at every call."""
    from tokenmerge.tools.architectures import at_noise, build_model, timestep_scale, transformer_inputs

    model = build_model("flux", small=True)
    inputs = at_noise(transformer_inputs(model, "flux", 16, 16, text_tokens=5), timestep_scale(model), 0.9)
    with tokenmerge.patched(model, method="auto", auto_max_keys=16, auto_min_tokens=16), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with torch.no_grad():
                model(**inputs)
    found = [m for m in _messages(caught) if "leaves this call whole" in m]
    assert len(found) == 1
    assert "noise level 0.900" in found[0] and "max_noise=0.4 (auto's default;" in found[0] and "max_noise=1" in found[0]


def test_a_cause_every_block_meets_is_said_once_for_the_patch_not_per_block():
    """One option mistake on a deep model: one warning (a real-depth Flux.1 gave 57, one per block)."""
    from tokenmerge.tools.architectures import build_model, transformer_inputs

    model = build_model("flux", small=True)  # 1 double- and 2 single-stream blocks
    inputs = transformer_inputs(model, "flux", 16, 16, text_tokens=5)
    with tokenmerge.patched(model, ratio=0.5, sx=16, sy=16), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.no_grad():
                model(**inputs)
    found = [m for m in _messages(caught) if "destination window" in m]
    assert len(found) == 1 and "said once, for every block it concerns" in found[0]


def test_an_attention_that_uses_its_rotary_table_another_way_falls_back_to_one_plan_per_batch_said_once():
    """Per-sample rotary rows reach an attention where it broadcasts its (S, D) table by a leading None index or by
    unsqueeze (hooks.tokens.SampleRows). Code that uses it otherwise (here: a processor that copies the table first)
    would give every sample the first one's rows: said once, and the patch shares its plans by the batch after."""
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    from tokenmerge.tools.architectures import build_model, transformer_inputs

    class CopiesTheTable(FluxAttnProcessor):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            table = None if image_rotary_emb is None else tuple(t.clone() for t in image_rotary_emb)
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, table)

    model = build_model("flux", small=True)
    model.set_attn_processor(CopiesTheTable())
    inputs = transformer_inputs(model, "flux", 16, 16, batch=2, text_tokens=5)
    with tokenmerge.patched(model, ratio=0.5), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(**inputs)
            model(**inputs)
        (state,) = [s for _, s in tokenmerge.hooks.states_in([model])]
        assert state.shared_plans
    found = [m for m in _messages(caught) if "its own rows" in m]
    assert len(found) == 1 and "one matching serves the whole batch" in found[0]


@pytest.mark.parametrize("name", ["StableAudioDiTModel", "UVit2DModel"])
def test_a_model_no_family_describes_is_refused_saying_so_and_why(name):
    """Stable Audio's DiT and aMUSEd's U-ViT hold transformer blocks, but no family module describes where their
    tokens, text and positions sit (an audio model; a masked-token image model): refused as unsupported, with the
    reason (never patched with a guessed layout)."""
    import diffusers

    small = {
        "StableAudioDiTModel": dict(
            sample_size=8,
            in_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            num_key_value_attention_heads=1,
            out_channels=4,
            cross_attention_dim=16,
            time_proj_dim=8,
            global_states_input_dim=8,
            cross_attention_input_dim=8,
        ),
        "UVit2DModel": dict(
            hidden_size=32,
            cond_embed_dim=16,
            micro_cond_encode_dim=4,
            micro_cond_embed_dim=20,
            encoder_hidden_size=16,
            vocab_size=10,
            codebook_size=8,
            in_channels=16,
            block_out_channels=16,
            num_res_blocks=1,
            downsample=False,
            upsample=False,
            block_num_heads=2,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        ),
    }[name]
    model = getattr(diffusers, name)(**small)
    with pytest.raises(
        TypeError, match=rf"{name}: no supported model family\. tokenmerge patches a model only where a family module describes"
    ):
        tokenmerge.apply_patch(model, method="auto")
    assert "no supported model family" in str(tokenmerge.describe(model))
