"""Patching is reversible, repeatable, serialisable and leaves the model's parameters alone."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import tokenmerge

from conftest import attn1_token_counts, sd_inputs

HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs")


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(getattr(m, name)) for m in model.modules() for name in HOOK_DICTS)


def _run(unet, inputs):
    with torch.no_grad():
        return unet(**inputs).sample


def test_remove_restores_bit_identical_outputs_and_leaves_nothing_behind(sd15_small):
    inputs = sd_inputs(sd15_small)
    vanilla = _run(sd15_small, inputs)
    attrs = {id(m): set(vars(m)) for m in sd15_small.modules()}
    classes = {id(m): type(m) for m in sd15_small.modules()}
    hooks = _hook_count(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.5)
    assert _hook_count(sd15_small) > hooks
    assert not torch.equal(_run(sd15_small, inputs), vanilla)
    tokenmerge.remove_patch(sd15_small)
    assert torch.equal(_run(sd15_small, inputs), vanilla)
    assert _hook_count(sd15_small) == hooks
    assert {id(m): set(vars(m)) for m in sd15_small.modules()} == attrs
    assert {id(m): type(m) for m in sd15_small.modules()} == classes
    assert tokenmerge.get_config(sd15_small) is None
    tokenmerge.remove_patch(sd15_small)  # removing twice is harmless


def test_apply_twice_equals_once_with_the_new_arguments(sd15_small):
    inputs = sd_inputs(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.3)
    hooks = _hook_count(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.6, seed=1)
    assert _hook_count(sd15_small) == hooks
    twice = _run(sd15_small, inputs)
    tokenmerge.remove_patch(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.6, seed=1)
    assert torch.equal(_run(sd15_small, inputs), twice)
    tokenmerge.remove_patch(sd15_small)


def test_options_change_between_calls_without_repatching(sd15_small):
    inputs = sd_inputs(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.25)
    tokenmerge.update_options(sd15_small, ratio=0.5)
    with attn1_token_counts(sd15_small) as counts:
        updated = _run(sd15_small, inputs)
    assert 128 in counts
    tokenmerge.apply_patch(sd15_small, ratio=0.5)
    assert torch.equal(_run(sd15_small, inputs), updated)
    tokenmerge.update_options(sd15_small, max_downsample=8)
    with attn1_token_counts(sd15_small) as counts:
        _run(sd15_small, inputs)
    assert 32 in counts  # the level-2 blocks (8x8) merge now too
    tokenmerge.remove_patch(sd15_small)


def test_state_dict_keys_and_dtype_moves_are_unaffected(sd15_small):
    keys = list(sd15_small.state_dict())
    tokenmerge.apply_patch(sd15_small)
    assert list(sd15_small.state_dict()) == keys
    sd15_small.load_state_dict(sd15_small.state_dict())
    sd15_small.to(torch.bfloat16)
    try:
        out = _run(sd15_small, sd_inputs(sd15_small))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    finally:
        sd15_small.to(torch.float32)
        tokenmerge.remove_patch(sd15_small)


def test_patched_model_survives_deepcopy_and_torch_save(sd15_small):
    inputs = sd_inputs(sd15_small)
    tokenmerge.apply_patch(sd15_small, ratio=0.5, seed=7)
    patched = _run(sd15_small, inputs)
    copied = copy.deepcopy(sd15_small)
    buffer = io.BytesIO()
    torch.save(sd15_small, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    tokenmerge.remove_patch(sd15_small)
    for clone in (copied, loaded):
        assert torch.equal(_run(clone, inputs), patched)
        assert tokenmerge.get_config(clone).seed == 7
        tokenmerge.update_options(clone, ratio=0.25)  # each clone has its own state
        assert tokenmerge.get_config(sd15_small) is None
        tokenmerge.remove_patch(clone)
        assert _hook_count(clone) == _hook_count(sd15_small)


def test_a_token_cache_patch_survives_deepcopy_and_torch_save():
    # its hooks are registered as objects torch.compile does not trace (hooks.state.Untraced): each copy owns its own
    from test_tokencache import generation

    from tokenmerge.tools.architectures import build_model, transformer_output

    model = build_model("flux", small=True)
    calls = generation("flux", batch=1, calls=6)
    tokenmerge.apply_patch(model, method="tokencache", recompute=0.25, full_steps=1, refresh_every=3)

    def run(m: torch.nn.Module) -> list[torch.Tensor]:
        with torch.no_grad(), tokenmerge.generation(m):
            return [transformer_output("flux", m(**c)) for c in calls]

    patched = run(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert all(torch.equal(a, b) for a, b in zip(run(clone), patched))
        tokenmerge.update_options(clone, method="tome")  # each clone has its own state
        assert tokenmerge.get_config(model).method == "tokencache"
        tokenmerge.remove_patch(clone)
        assert _hook_count(clone) == 0
    tokenmerge.remove_patch(model)


def test_tomesd_code_runs_unchanged(sd15_small):
    import tokenmerge as tomesd

    inputs = sd_inputs(sd15_small)
    vanilla = _run(sd15_small, inputs)
    model = tomesd.apply_patch(
        sd15_small, ratio=0.5, max_downsample=1, sx=2, sy=2, use_rand=True, merge_attn=True, merge_crossattn=False, merge_mlp=False
    )
    assert model is sd15_small
    assert tomesd.remove_patch(sd15_small) is sd15_small
    assert torch.equal(_run(sd15_small, inputs), vanilla)


def test_a_tomesd_patch_is_replaced_and_removal_restores_vanilla(sd15_small):
    import tomesd

    inputs = sd_inputs(sd15_small)
    vanilla = _run(sd15_small, inputs)
    tokenmerge.apply_patch(sd15_small, ratio=0.5, seed=1)
    ours = _run(sd15_small, inputs)
    tokenmerge.remove_patch(sd15_small)
    tomesd.apply_patch(sd15_small, ratio=0.5)
    with pytest.warns(UserWarning, match="patched by tomesd; that patch is removed and replaced"):
        tokenmerge.apply_patch(sd15_small, ratio=0.5, seed=1)
    assert torch.equal(_run(sd15_small, inputs), ours)  # only tokenmerge's patch acts (deterministic)
    tokenmerge.remove_patch(sd15_small)
    assert torch.equal(_run(sd15_small, inputs), vanilla)
    assert not any(type(m).__name__ == "ToMeBlock" or "_tome_info" in vars(m) for m in sd15_small.modules())
    tomesd.apply_patch(sd15_small, ratio=0.5)
    tokenmerge.remove_patch(sd15_small)  # removes tomesd's patch too: vanilla outputs again
    assert torch.equal(_run(sd15_small, inputs), vanilla)


def test_patched_context_manager_removes_the_patch_also_on_errors(sd15_small):
    inputs = sd_inputs(sd15_small)
    vanilla = _run(sd15_small, inputs)
    with pytest.raises(ZeroDivisionError):
        with tokenmerge.patched(sd15_small, ratio=0.5) as model:
            assert model is sd15_small and tokenmerge.get_config(sd15_small).ratio == 0.5
            raise ZeroDivisionError
    assert tokenmerge.get_config(sd15_small) is None
    assert torch.equal(_run(sd15_small, inputs), vanilla)


def test_patched_context_manager_restores_the_patch_it_found(sd15_small):
    """A context manager restores what it found: the earlier patch with its options, also after an exception."""
    inputs = sd_inputs(sd15_small)
    tokenmerge.apply_patch(sd15_small, method="todo", kv_factor=3)
    before = _run(sd15_small, inputs)
    try:
        with pytest.raises(ZeroDivisionError):
            with tokenmerge.patched(sd15_small, ratio=0.5):
                assert tokenmerge.get_config(sd15_small).method == "tome"
                raise ZeroDivisionError
        config = tokenmerge.get_config(sd15_small)
        assert config is not None and config.method == "todo" and config.kv_factor == 3
        assert torch.equal(_run(sd15_small, inputs), before)
    finally:
        tokenmerge.remove_patch(sd15_small)


def test_get_config_of_a_pipeline_whose_parts_differ_says_so_and_get_configs_gives_each():
    from diffusers import FluxControlNetModel

    from tokenmerge.tools.architectures import build_model

    transformer = build_model("flux", small=True)
    controlnet = FluxControlNetModel(**{k: v for k, v in transformer.config.items() if not k.startswith("_") and k != "out_channels"})

    class Pipe(torch.nn.Module):  # stand-in holder: a module with both (no DiffusionPipeline needed)
        def __init__(self):
            super().__init__()
            self.transformer, self.controlnet = transformer, controlnet

    holder = Pipe()
    tokenmerge.apply_patch(holder, ratio=0.5)
    tokenmerge.update_options(holder.controlnet, ratio=0.3)
    try:
        configs = tokenmerge.get_configs(holder)
        assert sorted(c.ratio for c in configs.values()) == [0.3, 0.5] and len(configs) == 2
        with pytest.warns(UserWarning, match=r"different options \(transformer: ratio=0\.5; controlnet: ratio=0\.3\)"):
            tokenmerge.get_config(holder)
    finally:
        tokenmerge.remove_patch(holder)


def test_config_argument_and_describe(sd15_small):
    config = tokenmerge.TokenMergeConfig(ratio=0.4, method="tome", seed=2)
    with tokenmerge.patched(sd15_small, config=config):
        assert tokenmerge.get_config(sd15_small) == config
        description = tokenmerge.describe(sd15_small, grid=(16, 16))
        text = str(description)
        assert "UNet2DConditionModel" in text and "merge 102 of 256 tokens (16x16) in attn1" in text
        assert [b.level for b in description.denoisers[0].patched_blocks] == [1, 1, 1]
    with pytest.raises(TypeError, match="either in config= or as arguments"):
        tokenmerge.apply_patch(sd15_small, ratio=0.3, config=config)
    assert str(tokenmerge.describe(sd15_small)) == "not patched by tokenmerge"


def test_an_attention_that_raises_leaves_no_key_value_mode_behind():
    """The SDPA mode a joint attention enters (Flux: keys and values are reduced where the attention runs) is left
    by its forward hook, or, where the attention raises, by the call's closing hook: the error reaches the caller,
    and the next call is the patch's own output."""
    from tokenmerge.hooks import dispatch
    from tokenmerge.tools.architectures import build_model, transformer_inputs

    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 16, 16)
    attention = model.transformer_blocks[0].attn
    opened = []

    def fail(module, args, kwargs):
        opened.append(torch._C._len_torch_function_stack())
        raise RuntimeError("attention failed")

    with torch.no_grad(), tokenmerge.patched(model, method="todo", max_noise=1):
        expected = model(**inputs).sample
        handle = attention.register_forward_pre_hook(fail, with_kwargs=True)  # after tokenmerge's: its mode is open
        try:
            with pytest.raises(RuntimeError, match="attention failed"):
                model(**inputs)
        finally:
            handle.remove()
        assert opened == [1]
        assert torch._C._len_torch_function_stack() == 0 and not dispatch.ACTIVE.stack
        assert torch.equal(model(**inputs).sample, expected)
