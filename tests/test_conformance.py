"""The conformance suite: every registered transformer family, every method, on a tiny config of its real classes.

A family ships only if it passes: identity options bit-identical; removal leaves no hook or attribute; keys and
values reduced (todo/auto) or image tokens merged (tome) as configured, and nothing else — text and reference
tokens keep their keys, checked against a reference computation on vanilla's keys; deterministic; batch 1-3 and
an image's result independent of its batch; odd, non-square grids; keyword and positional calls; deepcopy and
pickle; torch.compile. Parametrised over ``tokenmerge.tools.examples.examples()``: a new family is tested by adding it.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import TokenGrid, nearest_indices
from tokenmerge.tools.architectures import at_noise, build_model, timestep_scale, transformer_inputs, transformer_output
from tokenmerge.tools.examples import examples

from conftest import AttentionCalls, hook_count, model_of, sample_of

EXAMPLES = tuple(examples())
METHODS = {
    "tome": dict(ratio=0.5),
    "todo": dict(method="todo", kv_factor=2),
    "auto": dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1),  # the examples are at mid-noise
}
TEXT = 5
LATENT = (18, 14)  # a 9x7 token grid: odd and not square


def inputs_of(name: str, batch: int = 2, seed: int = 0, latent: tuple[int, int] = LATENT, references: bool = False) -> dict:
    if not references:
        return transformer_inputs(model_of(name), name, *latent, batch=batch, seed=seed, text_tokens=TEXT)
    # Reference images (edits) of their own sizes: a 2x3 and a 3x2 token grid.
    return examples()[name][1].inputs(model_of(name), *latent, batch, seed, TEXT, references=((2, 3), (3, 2)))


def _with_references() -> list:
    """(example, references) pairs: every example, and again with reference images where its family has them."""
    found = []
    for name, (_, example) in examples().items():
        found.append(pytest.param(name, False, id=name))
        if "references" in inspect.signature(example.inputs).parameters:
            found.append(pytest.param(name, True, id=f"{name}-references"))
    return found


def run(name: str, inputs: dict, model: torch.nn.Module | None = None) -> torch.Tensor:
    with torch.no_grad():
        return transformer_output(name, (model if model is not None else model_of(name))(**inputs))


def attention_calls(name: str, inputs: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    mode = AttentionCalls()
    with mode:
        run(name, inputs)
    return mode.calls


def call_layout(name: str, inputs: dict):
    """The joint token layout of this call, as the patch reads it (its first container's reader)."""
    (state,) = [s for _, s in tokenmerge.hooks.states_in([model_of(name)])]
    return state.layout.containers[0].layout((), inputs)


@pytest.mark.parametrize("name", EXAMPLES)
def test_identity_options_are_bit_identical_and_removal_leaves_nothing(name):
    model, inputs = model_of(name), inputs_of(name)
    vanilla = run(name, inputs)
    hooks, attributes = hook_count(model), {id(m): set(vars(m)) for m in model.modules()}
    processors = {id(m): type(getattr(m, "processor", None)) for m in model.modules()}
    for options in (dict(ratio=0.0), dict(method="todo", kv_factor=1)):
        with tokenmerge.patched(model, **options):
            assert torch.equal(run(name, inputs), vanilla)
    for options in METHODS.values():
        with tokenmerge.patched(model, **options):
            assert not torch.equal(run(name, inputs), vanilla), f"{options} changes nothing"
    assert torch.equal(run(name, inputs), vanilla)
    assert hook_count(model) == hooks and {id(m): set(vars(m)) for m in model.modules()} == attributes
    assert {id(m): type(getattr(m, "processor", None)) for m in model.modules()} == processors


@pytest.mark.parametrize("name", EXAMPLES)
def test_autos_default_reduces_only_the_low_noise_steps(name):
    """auto's default noise limit (0.4), read from each family's timestep scale: a step at noise 0.5 (the examples')
    runs bit-identical to vanilla, one at 0.25 has its image keys reduced."""
    model = model_of(name)
    scale = timestep_scale(model)
    mid, low = at_noise(inputs_of(name), scale, 0.5), at_noise(inputs_of(name), scale, 0.25)
    vanilla_mid, vanilla_low = run(name, mid), attention_calls(name, low)
    with tokenmerge.patched(model, method="auto", auto_max_keys=16, auto_min_tokens=16):
        assert torch.equal(run(name, mid), vanilla_mid)
        reduced = attention_calls(name, low)
    assert any(k.shape[-2] < k0.shape[-2] for (_, k0, _), (_, k, _) in zip(vanilla_low, reduced))


def _over_the_image(q: torch.Tensor, k: torch.Tensor, layout) -> bool:
    """Whether an attention call attends over the image: a self or joint attention (queries and keys of one
    sequence, at least the image's length), or the image's queries over a stream's keys (PRX: the text is keys
    only)."""
    if k.shape[-2] == q.shape[-2]:
        return k.shape[-2] >= layout.grid.numel
    return q.shape[-2] == layout.grid.numel and k.shape[-2] in {layout.stream(s).total for s in ("joint", "image", "target")}


@pytest.mark.parametrize("name,references", _with_references())
@pytest.mark.parametrize("method", ["todo", "auto"])
def test_keys_and_values_of_the_image_only_are_downsampled(name, references, method):
    """Every self/joint attention gets the image keys at the positions nearest-exact keeps and every other key (text,
    references) as it was; the first one is compared with vanilla's keys (same inputs up to there)."""
    inputs = inputs_of(name, references=references)
    vanilla = attention_calls(name, inputs)
    with tokenmerge.patched(model_of(name), **METHODS[method]):
        layout = call_layout(name, inputs)
        patched = attention_calls(name, inputs)
    grid = layout.grid
    assert layout.references or not references  # (some calls carry references of their own: Wan 2.2 TI2V's first frame)
    config = tokenmerge.TokenMergeConfig(**METHODS[method])
    factors = config.method_of.factors(config, grid)
    keep = nearest_indices(grid, factors, "nearest-exact", torch.device("cpu"))
    assert len(patched) == len(vanilla)
    reduced = []
    for i, ((q0, k0, _), (q, k, _)) in enumerate(zip(vanilla, patched)):
        assert q.shape == q0.shape  # queries keep every token
        if _over_the_image(q0, k0, layout):
            assert k.shape[-2] == k0.shape[-2] - grid.numel + keep.numel()
            reduced.append(i)
        else:
            assert k.shape == k0.shape
    assert reduced
    # The first reduced attention saw vanilla's inputs (every attention before it is unchanged).
    (q0, k0, _), (_, k, _) = vanilla[reduced[0]], patched[reduced[0]]
    stream = next(layout.stream(s) for s in ("joint", "image", "target") if layout.stream(s).total == k0.shape[-2])
    assert k0.shape[-2] == stream.total
    start = stream.image_start
    image = k0[..., start : start + grid.numel, :].index_select(-2, keep)
    expected = torch.cat([k0[..., :start, :], image, k0[..., start + grid.numel :, :]], dim=-2)
    assert torch.equal(k, expected)


@pytest.mark.parametrize("name,references", _with_references())
def test_tome_merges_the_image_tokens_only(name, references):
    inputs = inputs_of(name, references=references)
    vanilla = attention_calls(name, inputs)
    with tokenmerge.patched(model_of(name), ratio=0.5):
        layout = call_layout(name, inputs)
        patched = attention_calls(name, inputs)
    grid = layout.grid
    r = int(grid.numel * 0.5)
    merged = 0
    for (q0, k0, _), (q, k, _) in zip(vanilla, patched):
        if _over_the_image(q0, k0, layout):
            # r image tokens fewer among the queries and the keys; text and references all there
            assert q.shape[-2] == q0.shape[-2] - r and k.shape[-2] == k0.shape[-2] - r
            merged += 1
    assert merged


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("method", list(METHODS))
def test_deterministic_and_every_image_independent_of_its_batch(name, method):
    """Identical inputs give identical outputs whatever ran before, at batch sizes 1-3; a batch of three *different*
    samples gives each its result alone (up to float batching noise): one matching per sample, each sample's rotary
    rows and mask columns its own."""
    with tokenmerge.patched(model_of(name), seed=3, **METHODS[method]):
        for batch in (1, 2, 3):
            inputs = inputs_of(name, batch=batch, seed=batch)
            first = run(name, inputs)
            run(name, inputs_of(name, seed=9))
            assert torch.equal(run(name, inputs), first)
        batch, single = inputs_of(name, batch=3, seed=5), inputs_of(name, batch=1, seed=5)
        together = run(name, batch)
        for i in range(3):
            alone = run(name, {k: sample_of(v, single[k], i) for k, v in batch.items()})
            gap = ((together[i : i + 1] - alone).abs().max() / alone.abs().max()).item()
            assert gap < 1e-4, f"sample {i} of a batch of 3 differs from its result alone by {gap:.3g}"
        (state,) = [s for _, s in tokenmerge.hooks.states_in([model_of(name)])]
        assert not state.shared_plans


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("method", list(METHODS))
def test_inference_mode_gives_the_no_grad_result(name, method):
    """``with torch.inference_mode(): pipe(...)`` (servers, scripts, ComfyUI): inputs made inside it are inference
    tensors, which have no version counter; every family and method runs there, twice (the layout readers' caches),
    with the result of no_grad."""
    with tokenmerge.patched(model_of(name), seed=3, **METHODS[method]):
        expected = run(name, inputs_of(name))
        with torch.inference_mode():
            inputs = inputs_of(name)
            found = [transformer_output(name, model_of(name)(**inputs)) for _ in range(2)]
    assert all(torch.equal(f, expected) for f in found)


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("method", ["tome", "todo"])
def test_positional_calls_deepcopy_and_pickle(name, method):
    model, inputs = model_of(name), inputs_of(name)
    with tokenmerge.patched(model, **METHODS[method]):
        expected = run(name, inputs)
        params = [p for p in inspect.signature(type(model).forward).parameters if p != "self"]
        count = next((i for i, p in enumerate(params) if p not in inputs), len(params))
        args = tuple(inputs[p] for p in params[:count])
        rest = {k: v for k, v in inputs.items() if k not in params[:count]}
        with torch.no_grad():
            assert torch.equal(transformer_output(name, model(*args, **rest)), expected)
        clone = copy.deepcopy(model)
        assert torch.equal(run(name, inputs, clone), expected)
        loaded = pickle.loads(pickle.dumps(model))
        assert torch.equal(run(name, inputs, loaded), expected)
    assert tokenmerge.get_config(clone) is not None and tokenmerge.get_config(loaded) is not None
    tokenmerge.remove_patch(clone)
    tokenmerge.remove_patch(loaded)


# Tracing a whole model takes seconds per example on 2 cores: each example compiles under one method, the methods in
# turn (each method on a third of the families); tests/test_compile.py compiles each method on the UNet and on DiTs.
COMPILED = [(name, list(METHODS)[i % len(METHODS)]) for i, name in enumerate(EXAMPLES)]


@pytest.mark.parametrize(("name", "method"), COMPILED)
def test_compiles(name, method):
    model, inputs = model_of(name), inputs_of(name, latent=(16, 16))
    with tokenmerge.patched(model, **METHODS[method]):
        try:
            eager = run(name, inputs)
            compiled = run(name, inputs, torch.compile(model, backend="eager"))
        finally:
            torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)


def test_every_transformer_family_has_an_example_in_the_suite():
    from tokenmerge.families import families

    patchable = [f.name for f in families() if f.refused is None and f.kind == "transformer"]
    assert patchable and all(examples_of(f) for f in patchable)


def examples_of(family: str) -> list[str]:
    return [name for name, (f, _) in examples().items() if f.name == family]


def test_token_grid_of_a_layout_is_the_patch_grid():
    assert call_layout_free() == TokenGrid((9, 7))


def call_layout_free():
    with tokenmerge.patched(model_of("flux"), ratio=0.5):
        return call_layout("flux", inputs_of("flux")).grid


def _pipelines() -> list[tuple[str, str]]:
    return [(name, pipeline) for name, (family, _) in examples().items() for pipeline in family.pipelines[:1]]


class _VaeStandIn(torch.nn.Module):
    """What a pipeline's __init__ reads of a video VAE (its latent channels and compression), nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"latent_channels": 32})()
        self.temporal_compression_ratio, self.spatial_compression_ratio = 4, 16


@pytest.mark.parametrize("name,pipeline", _pipelines())
def test_the_family_pipeline_is_patched_whole(name, pipeline):
    """The family's diffusers pipeline, built around its tiny transformer (no encoders, VAE or scheduler needed to
    patch): apply_patch on the pipeline patches the transformer, remove_patch takes it off."""
    import diffusers

    cls = getattr(diffusers, pipeline)
    signature = inspect.signature(cls.__init__).parameters
    params = [p for p in signature if p not in ("self", "args", "kwargs")]
    model = build_model(name, small=True)
    slot = next(p for p in params if p in ("transformer", "unet"))
    # the components (and settings without a default, Krea 2's patch_size keeps its own) left out
    components = {p: None for p in params if p != slot and signature[p].default is inspect.Parameter.empty}
    if pipeline.startswith("HunyuanVideo15"):  # its __init__ reads vae.config whenever a vae attribute exists (upstream)
        components["vae"] = _VaeStandIn()
    try:
        pipe = cls(**components, **{slot: model})
    except (ImportError, NameError) as error:  # an optional dependency its __init__ needs (Cosmos' guardrail, torchvision)
        pytest.skip(f"{pipeline} cannot be built here: {error}")
    tokenmerge.apply_patch(pipe, method="auto")
    assert tokenmerge.get_config(model) is not None and tokenmerge.get_config(pipe).method == "auto"
    tokenmerge.remove_patch(pipe)
    assert tokenmerge.get_config(model) is None


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("method", ["tome", "todo"])
def test_gradient_checkpointing_gives_the_gradients_of_the_plain_forward(name, method):
    model = build_model(name, small=True)
    if not model._supports_gradient_checkpointing:
        pytest.skip(f"{type(model).__name__} has no gradient checkpointing")
    inputs = inputs_of(name)
    key = next(k for k in ("hidden_states", "x") if k in inputs)

    def gradients() -> list[torch.Tensor]:
        found = []
        for checkpointing in (False, True):
            model.disable_gradient_checkpointing() if not checkpointing else model.enable_gradient_checkpointing()
            x = (torch.stack(inputs[key]) if isinstance(inputs[key], list) else inputs[key]).clone().requires_grad_()
            given = list(x.unbind()) if isinstance(inputs[key], list) else x
            transformer_output(name, model(**{**inputs, key: given})).square().mean().backward()
            found.append(x.grad)
        return found

    try:
        plain, checkpointed = gradients()
    except TypeError as error:  # (HunyuanImage in diffusers 0.42.1 hands its checkpoint function keywords it does not take)
        pytest.skip(f"{type(model).__name__}'s own checkpointed forward fails unpatched (upstream): {error}")
    if not torch.allclose(plain, checkpointed, rtol=1e-4, atol=1e-6):
        pytest.skip(f"{type(model).__name__}'s own checkpointed forward differs from its plain one (upstream)")
    with tokenmerge.patched(model, **METHODS[method]):
        plain, checkpointed = gradients()
    torch.testing.assert_close(checkpointed, plain)
