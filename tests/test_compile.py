"""The patched UNet traces as one graph under torch.compile(fullgraph=True): no graph breaks from tokenmerge.

The eager backend checks tracing (what fullgraph is about) without the minutes an inductor build takes on CPU.
"""

from __future__ import annotations

import warnings

import pytest
import tomesd
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_model, transformer_inputs, transformer_output

from conftest import sd_inputs


@pytest.mark.parametrize(
    "options",
    [
        dict(ratio=0.5),
        dict(ratio=0.5, use_rand=False, merge_crossattn=True, merge_mlp=True),
        dict(method="todo"),
        dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1),
        dict(ratio=0.5, share_plan=True),
    ],
)
def test_patched_unet_compiles_with_fullgraph(sd15_small, options):
    inputs = sd_inputs(sd15_small, 16, 16)
    tokenmerge.apply_patch(sd15_small, **options)
    try:
        with torch.no_grad():
            eager = sd15_small(**inputs).sample
            compiled = torch.compile(sd15_small, fullgraph=True, backend="eager")(**inputs).sample
    finally:
        tokenmerge.remove_patch(sd15_small)
        torch._dynamo.reset()
    assert torch.equal(compiled, eager)


def test_tomesd_does_not_compile_with_fullgraph(sd15_small):
    """The contrast: tomesd's per-call hook state breaks the graph."""
    inputs = sd_inputs(sd15_small, 16, 16)
    tomesd.apply_patch(sd15_small, ratio=0.5)
    try:
        with torch.no_grad(), pytest.raises(Exception, match="RemovableHandle|Unsupported|graph break"):
            torch.compile(sd15_small, fullgraph=True, backend="eager")(
                inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"]
            )
    finally:
        tomesd.remove_patch(sd15_small)
        torch._dynamo.reset()


def test_patching_a_compiled_module_warns(sd15_small):
    """Graphs compiled before the patch ignore its hooks (torch skips hook guards by default): say so."""
    compiled = torch.compile(sd15_small, backend="eager")
    with pytest.warns(UserWarning, match="already compiled"):
        tokenmerge.apply_patch(compiled, ratio=0.5)
    tokenmerge.remove_patch(compiled)
    assert tokenmerge.get_config(sd15_small) is None


def test_a_model_compiled_in_place_before_the_patch_is_said(sd15_small):
    """diffusers' documented ``model.compile()`` compiles in place (no OptimizedModule): a patch after it is said too."""
    sd15_small.compile(backend="eager")
    try:
        with pytest.warns(UserWarning, match="already compiled"):
            tokenmerge.apply_patch(sd15_small, ratio=0.5)
    finally:
        tokenmerge.remove_patch(sd15_small)
        sd15_small._compiled_call_impl = None
        torch._dynamo.reset()


def test_whole_model_compile_says_once_that_the_noise_gate_cannot_act(sd15_small):
    """The timestep is not read inside a compiled graph: auto reduces every step there, said once when traced."""
    inputs = {**sd_inputs(sd15_small, 16, 16), "timestep": torch.tensor(900)}
    with tokenmerge.patched(sd15_small, method="auto", auto_max_keys=16, auto_min_tokens=16):
        compiled = torch.compile(sd15_small, backend="eager")
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                for _ in range(3):
                    compiled(**inputs)
        finally:
            torch._dynamo.reset()
    found = [str(w.message) for w in caught if "compile_repeated_blocks" in str(w.message)]
    assert len(found) == 1 and "max_noise=0.4 cannot act and every step is reduced" in found[0]


def test_regional_compilation_keeps_autos_noise_schedule(sd15_small):
    """diffusers' compile_repeated_blocks compiles the transformer blocks (fullgraph) and leaves the root, where the
    call's timestep is read, eager: auto's default max_noise still leaves a mid-noise step whole and reduces a low-noise
    one, each equal to the eager patched model (the documented way to keep max_noise under compile), within dynamo's
    default recompile limit (no block falls back to eager)."""
    inputs = sd_inputs(sd15_small, 16, 16)
    mid, low = {**inputs, "timestep": torch.tensor(500)}, {**inputs, "timestep": torch.tensor(200)}
    blocks = [m for m in sd15_small.modules() if type(m).__name__ in sd15_small._repeated_blocks]
    with torch.no_grad():
        vanilla_mid, vanilla_low = sd15_small(**mid).sample, sd15_small(**low).sample
        with tokenmerge.patched(sd15_small, method="auto", auto_max_keys=16, auto_min_tokens=16):
            eager_low = sd15_small(**low).sample
            sd15_small.compile_repeated_blocks(fullgraph=True, backend="eager")
            try:
                with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                    compiled_mid, compiled_low = sd15_small(**mid).sample, sd15_small(**low).sample
            finally:
                for block in blocks:
                    block._compiled_call_impl = None
                torch._dynamo.reset()
    assert torch.equal(compiled_mid, vanilla_mid)
    assert torch.equal(compiled_low, eager_low) and not torch.equal(compiled_low, vanilla_low)


@pytest.mark.parametrize(("name", "options"), [("flux", dict(ratio=0.5)), ("flux", dict(method="todo")), ("wan", dict(method="auto"))])
def test_regional_compilation_compiles_as_many_graphs_at_any_depth(name, options):
    """Under compile_repeated_blocks a patched block's hooks read its call's state without its index (an int a graph
    would be specialised on), so the blocks share their graphs as unpatched ones do: 3 blocks compile no more graphs
    than 1, each block's output that of the eager patched model. (Flux's todo also covers a key/value mode entered
    inside a compiled block, where Flux's processor calls Tensor.unflatten.)"""
    options = {"max_noise": 1, **options, **({"auto_max_keys": 16, "auto_min_tokens": 16} if options.get("method") == "auto" else {})}
    counts = []
    for blocks in (1, 3):
        model = build_model(name, small=True, blocks=blocks)
        inputs = transformer_inputs(model, name, 16, 16)
        graphs = []

        def count(gm, example_inputs, graphs=graphs):
            graphs.append(gm)
            return gm.forward

        with torch.no_grad():
            vanilla = transformer_output(name, model(**inputs))
            with tokenmerge.patched(model, **options):
                eager = transformer_output(name, model(**inputs))
                model.compile_repeated_blocks(fullgraph=True, backend=count)
                try:
                    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                        compiled = [transformer_output(name, model(**inputs)) for _ in range(2)]
                finally:
                    torch._dynamo.reset()
        assert all(torch.equal(c, eager) for c in compiled) and not torch.equal(eager, vanilla)
        counts.append(len(graphs))
    assert counts[0] == counts[1], f"{counts[0]} graphs with 1 block, {counts[1]} with 3"


@pytest.mark.parametrize(("name", "how"), [("flux", "whole"), ("flux", "blocks"), ("wan", "blocks")])
def test_the_token_cache_under_compile_acts_as_in_eager_within_the_recompile_limit(name, how):
    """``torch.compile(transformer)`` and diffusers' ``compile_repeated_blocks()`` on a token-cache patch: its hooks run
    eagerly as graph breaks (PatchState.bind_hooks), the compiled pieces between them see a full step's or a cached
    step's tokens; two generations and a second size give the eager patch's outputs, and no code object is compiled
    more than four times (``fail_on_recompile_limit_hit``). (Wan's blocks run whole on the recomputed tokens: its
    residual per block.)"""
    from test_tokencache import generation

    model = build_model(name, small=True)
    calls = generation(name, batch=1, calls=6)
    other = transformer_inputs(model, name, 12, 12, batch=1, seed=3, text_tokens=5)
    with torch.no_grad():
        vanilla = [transformer_output(name, model(**c)) for c in calls]
    tokenmerge.apply_patch(model, method="tokencache", recompute=0.25, full_steps=1, refresh_every=3)
    with torch.no_grad(), tokenmerge.generation(model):
        eager = [transformer_output(name, model(**c)) for c in calls]
    compiled = torch.compile(model, backend="eager") if how == "whole" else model
    if how == "blocks":
        model.compile_repeated_blocks(backend="eager")
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.fail_on_recompile_limit_hit, torch._dynamo.config.recompile_limit = True, 4
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            runs = []
            for _ in range(2):
                with tokenmerge.generation(model):
                    runs.append([transformer_output(name, compiled(**c)) for c in calls])
            compiled(**other)
    finally:
        torch._dynamo.config.fail_on_recompile_limit_hit, torch._dynamo.config.recompile_limit = False, limit
        tokenmerge.remove_patch(model)
        torch._dynamo.reset()
    assert not [w for w in caught if "tokenmerge" in str(w.message)]  # nothing to say: it acts
    assert any(not torch.allclose(e, v, atol=1e-5) for e, v in zip(eager, vanilla))  # the cache acted
    for run in runs:
        for out, expected in zip(run, eager, strict=True):
            assert ((out - expected).norm() / expected.norm()) < 1e-4


def test_hooks_are_left_to_compilation_unless_the_method_keeps_state_across_calls():
    """ToMe's hooks are traced into a compiled graph (fullgraph works: the tests above); a method keeping state across
    a generation's calls has its hooks registered as functions torch.compile does not trace, and update_options
    switches between the two."""
    from tokenmerge.hooks.state import Untraced

    model = build_model("flux", small=True)

    def traced() -> bool:
        return all(not isinstance(h, Untraced) for m in model.modules() for h in m._forward_pre_hooks.values())

    tokenmerge.apply_patch(model, ratio=0.5)
    assert traced()
    tokenmerge.update_options(model, method="tokencache")
    assert not traced()
    tokenmerge.update_options(model, method="auto")
    assert traced()
    tokenmerge.remove_patch(model)
