"""The ComfyUI node on ComfyUI's own diffusion transformers, in real ComfyUIs (0.3.64 and 0.33.0,
``../shared/thirdparty``).

One subprocess per ComfyUI (notcomfy, the older ``comfy`` the other ComfyUI tests use, must not shadow the checkout there): the
repository cloned into a ``custom_nodes/`` folder is loaded by ComfyUI's ``nodes.init_external_custom_nodes``; each
model is built from ComfyUI's ``supported_models`` configs with random weights (tiny widths) and sampled through
``nodes.common_ksampler``. Per model: identity options bit-identical, keys reduced as configured (counted by an
override of another node's, which tokenmerge's chains), text and cross-attention untouched, determinism, the
original MODEL unchanged (patching works on a clone), a second node in a chain replacing the first. The UNet node
is re-checked on this ComfyUI too. Skipped with the reason where the checkout or its import needs are missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmerge.families import get as get_family
from tokenmerge.tools.examples import comfy_examples

ROOT = Path(__file__).parents[1]
THIRDPARTY = ROOT.parent / "shared" / "thirdparty"
NEEDS = ("torchsde", "trampoline", "sentencepiece", "aiohttp", "pydantic_settings", "dotenv", "av")
# ComfyUI version -> the modules its imports need beyond NEEDS
VERSIONS = {"0.3.64": (), "0.33.0": ("comfy_kitchen", "comfy_aimdo")}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split("."))


def models_of(version: str) -> tuple[str, ...]:
    """The families with a ComfyUI example (tokenmerge.tools.examples) that this ComfyUI has."""
    return tuple(name for name, example in comfy_examples().items() if _version(example.since) <= _version(version))


CASES = [(version, name) for version in VERSIONS for name in models_of(version)]


def _worker(checkout: str, custom_nodes: str, models: list[str]) -> dict:
    import asyncio

    import torch

    from tokenmerge.integrations.comfyui import comfy_noise
    from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run, import_comfy_checkout, sigma_at_noise

    import_comfy_checkout(checkout)
    import folder_paths
    import nodes

    folder_paths.folder_names_and_paths["custom_nodes"] = ([custom_nodes], set())
    asyncio.run(nodes.init_external_custom_nodes())
    node = nodes.NODE_CLASS_MAPPINGS["TokenMergingTokenmerge"]()
    from tokenmerge.families import comfy_model_of
    from tokenmerge.tools import comfy_dits

    report: dict = {"node_module": type(node).__module__, "models": {}}
    for name in models:
        model = comfy_dits.build(name)
        found = comfy_model_of(model.model.diffusion_model, model.model.model_config.unet_config.get("image_model"))
        grid = comfy_dits.grid_at(name, found.patch_of(model.model.diffusion_model))
        seeded = _seeded_whatever_memory_holds(comfy_dits, name, model)
        vanilla = comfy_dits.sample(model, name)
        counter = comfy_dits.KeyCounter()
        other = model.clone()  # another node's override (SageAttention and the like set one)
        other.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = counter
        plain = comfy_dits.sample(other, name)
        seen_plain = list(counter.calls)
        identity = comfy_dits.sample(node.patch(other, method="todo", kv_factor=1)[0], name)
        counter.calls.clear()
        patched = node.patch(other, method="todo", kv_factor=2)[0]
        first = comfy_dits.sample(patched, name)
        seen_todo = list(counter.calls)
        again = comfy_dits.sample(patched, name)
        chained = node.patch(patched, method="todo", kv_factor=4)[0]  # a second tokenmerge node replaces the first
        counter.calls.clear()
        comfy_dits.sample(chained, name)
        seen_chained = list(counter.calls)
        later = node.patch(model, method="todo", kv_factor=2)[0]
        later_counter = comfy_dits.KeyCounter()  # another node's override set after tokenmerge's (ModelAttentionBackend)
        later.model_options["transformer_options"]["optimized_attention_override"] = later_counter
        comfy_dits.sample(later, name)
        seen_later = list(later_counter.calls)
        counter.calls.clear()
        comfy_dits.sample(node.patch(other, method="todo", kv_factor=2, max_noise=0.95)[0], name)
        seen_scheduled = list(counter.calls)  # step 1 at pure noise, step 2 at about half
        auto = node.patch(other, method="auto", auto_max_keys=16, auto_min_tokens=16)[0]  # auto's default max_noise
        counter.calls.clear()
        comfy_dits.sample(auto, name, 11)  # a many-step schedule (more than 10 steps): its first step is at pure noise
        seen_auto_noisy = counter.calls[: len(seen_plain) // 2]
        counter.calls.clear()
        comfy_dits.sample(auto, name, 1, noise=0.25)  # the bench's step
        seen_auto_low = list(counter.calls)
        counter.calls.clear()
        comfy_dits.sample(auto, name, 4)  # a few-step schedule: the sampler's sigmas say which steps are its last
        seen_auto_four = list(counter.calls)
        counter.calls.clear()
        comfy_dits.sample(other, name, 1, noise=0.25)
        seen_plain_low = list(counter.calls)
        sampling = other.get_model_object("model_sampling")
        bench_noise = comfy_noise(sampling, torch.tensor([sigma_at_noise(sampling, 0.25)]))
        rows = {}
        for key, seed, patch in (("plain", 0, None), ("other_latent", 1, None), ("todo", 0, dict(method="todo", kv_factor=2))):
            keys = comfy_dits.FirstKeys(grid)
            recorded = model.clone()
            recorded.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = keys
            comfy_dits.sample(node.patch(recorded, **patch)[0] if patch else recorded, name, 1, seed=seed)
            rows[key] = keys.keys
        counter.calls.clear()
        after = comfy_dits.sample(other, name)  # the MODEL the node was given: untouched
        report["models"][name] = {
            "plain_equal": bool(torch.equal(plain, vanilla)),
            "identity_equal": bool(torch.equal(identity, vanilla)),
            "todo_rel_l2": comfy_dits.relative_l2(first, vanilla),
            "deterministic": bool(torch.equal(first, again)),
            "original_after_equal": bool(torch.equal(after, vanilla)),
            "override_kept": other.model_options["transformer_options"]["optimized_attention_override"] is counter,
            "calls_plain": seen_plain,
            "calls_todo": seen_todo,
            "calls_chained": seen_chained,
            "calls_later": seen_later,
            "calls_scheduled": seen_scheduled,
            "calls_auto_noisy": seen_auto_noisy,
            "calls_auto_low": seen_auto_low,
            "calls_auto_four": seen_auto_four,
            "calls_plain_low": seen_plain_low,
            "bench_noise": bench_noise,
            "seeded": seeded,
            "comfy_model": found.title,
            "image_tokens": grid,
            # where the latent's tokens sit in the first attention over the grid (the rows another latent changes; the
            # text's come from the prompt), and which rows todo dropped there
            "latent_rows": [i for i in range(len(rows["plain"])) if not torch.equal(rows["plain"][i], rows["other_latent"][i])],
            "dropped_rows": sorted(set(range(len(rows["plain"]))) - set(comfy_dits.kept_rows(rows["todo"], rows["plain"]))),
        }
        if found.blocks is not None:
            report["models"][name]["tome"] = _tome_blocks(comfy_dits, node, name, model, found, vanilla)
            report["models"][name]["tokencache"] = _tokencache_blocks(comfy_dits, node, name, model, found)
    report["workflows"] = _tokencache_workflows(comfy_dits, node)
    report["compiled"] = _compiled(comfy_dits, node)
    report["threads_equal"] = _threads(comfy_dits, node)
    if "z-image" in models:
        report["threads_equal_wrapped"] = _threads(comfy_dits, node, "z-image", method="tome", ratio=0.5)
    unet = build_comfy_patcher("sd15-small")
    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    context = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    base = comfy_run(unet, x, context=context)
    report["unet"] = {
        "identity_equal": bool(torch.equal(comfy_run(node.patch(unet, ratio=0.0)[0], x, context=context), base)),
        "tome_rel_l2": comfy_dits.relative_l2(comfy_run(node.patch(unet, ratio=0.5)[0], x, context=context), base),
        "todo_rel_l2": comfy_dits.relative_l2(comfy_run(node.patch(unet, method="todo", kv_factor=2)[0], x, context=context), base),
    }
    return report


class _BlockRecorder:
    """Another node's block replace patch: records the image stream's length each block runs on."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, args: dict, extra: dict) -> dict:
        self.seen.append(args["img"].shape[1])
        return extra["original_block"](args)

    def __deepcopy__(self, memo: dict):
        return self


def _permutation_plan(x):
    """A MergePlan that merges nothing and reorders every sample's tokens its own way: a block run on it, with its
    rotary rows following, gives the unpatched block's output (attention is permutation-equivariant)."""
    import torch

    from tokenmerge.algorithms import MergePlan

    b, n = x.shape[0], x.shape[1]
    g = torch.Generator().manual_seed(n)
    keep = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    none = torch.zeros(b, 0, dtype=torch.long)
    return MergePlan(keep, none, none, torch.ones(b, n, 1), torch.argsort(keep, dim=1))


def _recording(model, found) -> tuple:
    """(recorder, clone, hooks): a clone of ``model`` whose every block is another node's block patch recording the
    tokens it runs on (or, on a model without block patches, the model's layers hooked: their attention sees the
    sequence the layer runs on); remove the hooks after."""
    recorder = _BlockRecorder()
    other = model.clone()
    hooks = []
    for kind, attribute in found.blocks.lists:
        for i, block in enumerate(getattr(model.model.diffusion_model, attribute)):
            if found.blocks.wrapped:  # no block patches (NextDiT)
                hooks.append(block.attention.register_forward_pre_hook(lambda _, a: recorder.seen.append(a[0].shape[1])))
            else:
                other.set_model_patch_replace(recorder, "dit", kind, i)
    return recorder, other, hooks


def _tome_blocks(comfy_dits, node, name: str, model, found, vanilla) -> dict:
    """ToMe through the block replace patches, chained over another node's block patches (or, on a model without
    them, through its wrapped layers)."""
    import torch

    from tokenmerge.integrations.comfyui import blocks as comfyui_blocks
    from tokenmerge.methods import BlockAction

    recorder, other, hooks = _recording(model, found)
    plain = comfy_dits.sample(other, name)
    seen_plain = list(recorder.seen)
    identity = comfy_dits.sample(node.patch(other, method="tome", ratio=0.0)[0], name)
    patched = node.patch(other, method="tome", ratio=0.5)[0]
    recorder.seen.clear()
    first = comfy_dits.sample(patched, name)
    seen_tome = list(recorder.seen)
    again = comfy_dits.sample(patched, name)
    replaced = comfy_dits.sample(node.patch(patched, method="todo", kv_factor=1)[0], name)  # a second node replaces it
    decide = comfyui_blocks.decide
    comfyui_blocks.decide = lambda config, facts: BlockAction(plan=_permutation_plan(facts.tokens()))
    try:
        permuted = comfy_dits.sample(node.patch(other, method="tome", ratio=0.5)[0], name)
    finally:
        comfyui_blocks.decide = decide
        for hook in hooks:
            hook.remove()
    return {
        "plain_equal": bool(torch.equal(plain, vanilla)),
        "identity_equal": bool(torch.equal(identity, vanilla)),
        "replaced_equal": bool(torch.equal(replaced, vanilla)),
        "rel_l2": comfy_dits.relative_l2(first, vanilla),
        "deterministic": bool(torch.equal(first, again)),
        "permuted_rel_l2": comfy_dits.relative_l2(permuted, vanilla),
        "seen_plain": seen_plain,
        "seen_tome": seen_tome,
    }


STEPS = 6
# steps 1-2 full, 3-6 cached; kept exactly (the node's "model"), so that a cached step on unchanged inputs can equal the
# full step to rounding (the workflows below keep the default, int8)
CACHE = dict(method="tokencache", recompute=0.5, full_steps=1, refresh_every=10, cache_dtype="model")


def _tokencache_blocks(comfy_dits, node, name: str, model, found) -> dict:
    """The token cache through the block replace patches (over another node's block patches, or the wrapped layers of
    a model without them) and the attention override (under another node's override set after it)."""
    import torch

    recorder, other, hooks = _recording(model, found)
    try:
        vanilla = comfy_dits.sample(model, name, STEPS)
        recorder.seen.clear()
        plain = comfy_dits.sample(other, name, STEPS)
        seen_plain = list(recorder.seen)
        identity = comfy_dits.sample(node.patch(other, **{**CACHE, "recompute": 1.0})[0], name, STEPS)
        patched = node.patch(other, **CACHE)[0]
        recorder.seen.clear()
        first = comfy_dits.sample(patched, name, STEPS)
        seen_cache = list(recorder.seen)
    finally:
        for hook in hooks:
            hook.remove()
    cache = patched.model_options["transformer_options"]["optimized_attention_override"]
    held_after = cache._generations.nbytes
    again = comfy_dits.sample(patched, name, STEPS)
    later = node.patch(model, **CACHE)[0]
    counter = comfy_dits.KeyCounter()  # another node's override set after tokenmerge's: it gets every key
    later.model_options["transformer_options"]["optimized_attention_override"] = counter
    comfy_dits.sample(later, name, STEPS)
    return {
        "plain_equal": bool(torch.equal(plain, vanilla)),
        "identity_equal": bool(torch.equal(identity, vanilla)),
        "rel_l2": comfy_dits.relative_l2(first, vanilla),
        "deterministic": bool(torch.equal(first, again)),
        "freed": held_after == 0,
        "seen_plain": seen_plain,
        "seen_cache": seen_cache,
        "calls_later": counter.calls,
        "unchanged_rel_l2": _cached_step_of_unchanged_input(comfy_dits, node, name, model),
    }


SAMPLERS = ("euler_ancestral", "dpmpp_2m_sde", "dpmpp_3m_sde", "heun", "dpm_2", "uni_pc", "lcm", "res_multistep")


def _tokencache_workflows(comfy_dits, node, name: str = "flux", steps: int = 8) -> dict:
    """The token cache as people chain it in ComfyUI (Flux.1, 8 steps): the samplers people use; a prompt cancelled
    mid-run, then the same run; KSamplerAdvanced's split (steps 0-4 returning leftover noise, then 4-8 on another
    model, as Wan 2.2's experts run); a batch of two; weights changed between prompts (a LoRA's patches); fp8 weight
    storage (the loaders' ``weight_dtype``)."""
    import comfy.model_management
    import comfy.sample
    import nodes
    import torch

    options = {**CACHE, "cache_dtype": "int8"}  # the default, as people run it
    model = comfy_dits.build(name)
    patched = node.patch(model, **options)[0]
    cache = patched.model_options["transformer_options"]["optimized_attention_override"]
    positive, negative = comfy_dits.conditioning(name)

    def run(m, sampler="euler", latent=None, n=steps, **kwargs):
        latent = latent or comfy_dits.latent(name)
        with torch.inference_mode():
            return nodes.common_ksampler(m, 0, n, 2.0, sampler, "simple", positive, negative, latent, **kwargs)[0]["samples"]

    samplers = {}
    for sampler in SAMPLERS:
        vanilla, first, again = run(model, sampler), run(patched, sampler), run(patched, sampler)
        samplers[sampler] = {
            "deterministic": bool(torch.equal(first, again)),
            "rel_l2": comfy_dits.relative_l2(first, vanilla),
            "finite": bool(torch.isfinite(first).all()),
        }
    alone = run(patched)

    def cancel_at_step(step: int):
        def callback(i, *args):
            if i == step:
                raise comfy.model_management.InterruptProcessingException()

        return callback

    x = comfy.sample.fix_empty_latent_channels(model, comfy_dits.latent(name)["samples"])
    cancelled = False
    try:
        with torch.inference_mode():
            comfy.sample.sample(
                patched,
                comfy.sample.prepare_noise(x, 0),
                steps,
                2.0,
                "euler",
                "simple",
                positive,
                negative,
                x,
                callback=cancel_at_step(5),
                seed=0,
            )
    except comfy.model_management.InterruptProcessingException:
        cancelled = cache._generations.nbytes == 0
    after_cancel = run(patched)
    other = node.patch(comfy_dits.build(name, seed=1), **options)[0]
    first_half = run(patched, start_step=0, last_step=4, force_full_denoise=False)
    second_half = run(other, latent={"samples": first_half}, disable_noise=True, start_step=4, last_step=steps, force_full_denoise=True)
    second_alone = run(
        node.patch(comfy_dits.build(name, seed=1), **options)[0],
        latent={"samples": first_half},
        disable_noise=True,
        start_step=4,
        last_step=steps,
        force_full_denoise=True,
    )
    pair = run(patched, latent={"samples": torch.zeros(2, *comfy_dits.latent(name)["samples"].shape[1:])})
    lora = patched.clone()
    key = next(k for k in lora.model.state_dict() if k.endswith(".weight") and "double_blocks.0.img_attn.qkv" in k)
    lora.add_patches({key: (0.05 * torch.ones_like(lora.model.state_dict()[key]),)}, 1.0)
    run(patched)
    changed = run(lora)
    fresh = model.clone()
    fresh.add_patches({key: (0.05 * torch.ones_like(fresh.model.state_dict()[key]),)}, 1.0)
    changed_alone = run(node.patch(fresh, **options)[0])
    few = {k: run(m, n=4) for k, m in (("vanilla", model), ("preset", node.patch(model, method="tokencache")[0]))}
    few["given"] = run(node.patch(model, method="tokencache", full_steps=3)[0], n=4)
    fp8 = comfy_dits.build(name, weight_dtype=torch.float8_e4m3fn)
    fp8_vanilla, fp8_cached = run(fp8), run(node.patch(fp8, **options)[0])
    return {
        "samplers": samplers,
        "few_step_rel_l2": comfy_dits.relative_l2(few["preset"], few["vanilla"]),
        "few_step_given_equal": bool(torch.equal(few["given"], few["vanilla"])),
        "cancelled_and_freed": cancelled,
        "after_cancel_equal": bool(torch.equal(after_cancel, alone)),
        "split_equal": bool(torch.equal(second_half, second_alone)),
        "split_rel_l2": comfy_dits.relative_l2(second_half, run(model)),
        "batch_rel": comfy_dits.relative_l2(pair[:1], alone),
        "weights_changed_equal": bool(torch.equal(changed, changed_alone)),
        "weights_changed_differs": not bool(torch.equal(changed, alone)),
        "fp8_rel_l2": comfy_dits.relative_l2(fp8_cached, fp8_vanilla),
        "fp32_rel_l2": comfy_dits.relative_l2(alone, run(model)),
    }


def _compiled(comfy_dits, node, name: str = "flux", steps: int = 8) -> dict:
    """ComfyUI's TorchCompileModel node after tokenmerge's (the node's own code, its ``torch.compile`` given the eager
    backend: inductor's build takes minutes on a CPU): two generations at one size and one at another, within four
    compilations per code object; against the uncompiled patch, and what was said."""
    import warnings

    import comfy_extras.nodes_torch_compile as compile_node
    import nodes
    import torch

    model = comfy_dits.build(name)
    patched = node.patch(model, **{**CACHE, "cache_dtype": "int8"})[0]
    positive, negative = comfy_dits.conditioning(name)

    def run(m, size: int = 32, seed: int = 0):
        with torch.inference_mode():
            latent = comfy_dits.latent(name, size, size)
            return nodes.common_ksampler(m, seed, steps, 2.0, "euler", "simple", positive, negative, latent)[0]["samples"]

    eager = [run(patched), run(patched, seed=1), run(patched, size=48)]
    real = compile_node.set_torch_compile_wrapper
    compile_node.set_torch_compile_wrapper = lambda **kwargs: real(**{**kwargs, "backend": "eager"})
    try:
        output = compile_node.TorchCompileModel.execute(patched, "inductor")
    finally:
        compile_node.set_torch_compile_wrapper = real
    compiled = output.result[0] if hasattr(output, "result") else output[0]
    config = torch._dynamo.config
    limit, config.recompile_limit, config.fail_on_recompile_limit_hit = config.recompile_limit, 4, True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs = [run(compiled), run(compiled, seed=1), run(compiled, size=48)]
    finally:
        config.recompile_limit, config.fail_on_recompile_limit_hit = limit, False
        torch._dynamo.reset()
    return {
        "rel_l2": [comfy_dits.relative_l2(a, b) for a, b in zip(runs, eager)],
        "acts": comfy_dits.relative_l2(eager[0], run(model)),
        "said": [str(w.message) for w in caught if "tokenmerge" in str(w.message)],
    }


def _cached_step_of_unchanged_input(comfy_dits, node, name: str, model) -> float:
    """The same call three times in one generation (the slot memory reset between them, so that each counts as the
    next step): the third is a cached step on the inputs the second, a full step, computed every token from; every
    token's keys, rotary row and residual right, it gives the full step's output (to rounding)."""
    import comfy.sample
    import comfy.samplers
    import torch

    outputs: list = []
    probed = model.clone()

    def thrice(executor, *args, **kwargs):  # outside tokenmerge's apply_model wrapper: three calls of it
        for _ in range(3):  # each the next step: the slot's timestep and noise level forgotten
            generations = cache.generations()
            generations.last = (None, -1)
            for slot in generations.slots:
                slot.noise = None
            outputs.append(executor(*args, **kwargs))
        return outputs[-1]

    probed.add_wrapper_with_key("apply_model", "probe", thrice)
    patched = node.patch(probed, **CACHE)[0]
    cache = patched.model_options["transformer_options"]["optimized_attention_override"]
    positive, negative = comfy_dits.conditioning(name)
    x = comfy.sample.fix_empty_latent_channels(model, comfy_dits.latent(name)["samples"])
    guider = comfy.samplers.CFGGuider(patched)
    guider.set_conds(positive, negative)
    guider.set_cfg(2.0)
    sigmas = torch.tensor([float(model.get_model_object("model_sampling").percent_to_sigma(0.3)), 0.0])
    with torch.inference_mode():
        guider.sample(comfy.sample.prepare_noise(x, 0), x, comfy.samplers.sampler_object("euler"), sigmas, seed=0)
    return comfy_dits.relative_l2(outputs[2], outputs[1])


def _seeded_whatever_memory_holds(comfy_dits, name: str, model) -> bool:
    """Built again with every ``torch.empty`` full of NaN (uninitialised memory may hold anything, and differs
    between machines): every float of the model is finite and equals the first build's."""
    import torch

    empty = torch.empty

    def nan_empty(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    torch.empty = nan_empty
    try:
        again = comfy_dits.build(name).model.state_dict()
    finally:
        torch.empty = empty
    first = model.model.state_dict()
    return first.keys() == again.keys() and all(torch.equal(first[key], again[key]) for key in first)


def _threads(comfy_dits, node, name: str = "flux", **options) -> bool:
    """Four threads call one patched model at once (Flux with todo; Z-Image with tome, whose layers are wrapped while
    any call runs), at different latent sizes: each gets its sequential output."""
    import threading

    import torch

    patched = node.patch(comfy_dits.build(name), **(options or dict(method="todo", kv_factor=2)))[0]
    example = comfy_dits.example(name)

    def call(size: int, seed: int) -> torch.Tensor:
        options = {**patched.model_options["transformer_options"], "wrappers": patched.wrappers}
        g = torch.Generator().manual_seed(seed)
        x, context = torch.randn(1, example.channels, size, size, generator=g), torch.randn(1, 8, example.context, generator=g)
        extra = (
            {"y": torch.randn(1, example.pooled, generator=g), "guidance": torch.full((1,), 3.5)} if example.pooled else {"num_tokens": 8}
        )
        with torch.inference_mode():
            return patched.model.apply_model(x, torch.full((1,), 0.7), c_crossattn=context, transformer_options=options, **extra)

    sizes = (32, 24, 32, 16)
    sequential = [call(size, i) for i, size in enumerate(sizes)]
    concurrent: list = [None] * len(sizes)
    threads = [threading.Thread(target=lambda i=i, size=size: concurrent.__setitem__(i, call(size, i))) for i, size in enumerate(sizes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return all(torch.equal(a, b) for a, b in zip(sequential, concurrent))


_REPORTS: dict[str, dict | BaseException] = {}


@pytest.fixture
def comfyui(request, tmp_path_factory) -> dict:
    """The worker's report on the ComfyUI version the test is parametrised with (one run per version, kept for the
    session; skipped where the checkout under ``../shared/thirdparty`` or its imports are absent)."""
    version = request.param
    if version not in _REPORTS:
        try:
            _REPORTS[version] = _report(version, tmp_path_factory)
        except BaseException as error:  # a skip or a failed run: said by every test of that version, run once
            _REPORTS[version] = error
    found = _REPORTS[version]
    if isinstance(found, BaseException):
        raise found
    return found


def _report(version: str, tmp_path_factory) -> dict:
    checkout = THIRDPARTY / f"comfyui-{version}"
    if not checkout.is_dir():
        pytest.skip(f"no ComfyUI checkout at {checkout} (../shared/thirdparty/comfyui-{version})")
    import importlib.util

    needs, models = VERSIONS[version], models_of(version)
    missing = [m for m in (*NEEDS, *needs) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"ComfyUI {version}'s imports need {', '.join(missing)} (.ci/run installs them)")
    from test_install_paths import clone_into

    custom_nodes = tmp_path_factory.mktemp("ComfyUI") / "custom_nodes"
    clone_into(custom_nodes)
    result = subprocess.run(
        [sys.executable, __file__, str(checkout), str(custom_nodes), ",".join(models)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


each_model = pytest.mark.parametrize("comfyui,name", CASES, indirect=["comfyui"])
each_version = pytest.mark.parametrize("comfyui", list(VERSIONS), indirect=True)


@each_model
def test_every_weight_and_buffer_is_seeded_whatever_uninitialised_memory_holds(comfyui, name):
    assert comfyui["models"][name]["seeded"]


@each_version
def test_the_node_is_loaded_by_comfyuis_custom_node_loader(comfyui):
    assert comfyui["node_module"] == "tokenmerge.integrations.comfyui.node"


@each_model
def test_each_model_is_recognised_as_its_family(comfyui, name):
    """One ComfyUI class can serve several families (``Flux``: Flux.1's 2x2 patches, Flux.2's 1x1): the family comes
    from the model's config, and the token grid from the instance's own patch size."""
    found = comfyui["models"][name]
    from tokenmerge.families import get

    assert found["comfy_model"] == get(comfy_examples()[name].family).comfy.title


@each_model
def test_identity_options_are_bit_identical_and_the_original_model_is_untouched(comfyui, name):
    found = comfyui["models"][name]
    assert found["plain_equal"] and found["identity_equal"] and found["original_after_equal"] and found["override_kept"]


@each_model
def test_image_keys_are_reduced_as_configured_through_the_chained_override(comfyui, name):
    found = comfyui["models"][name]
    assert found["todo_rel_l2"] > 1e-4 and found["deterministic"]
    plain, todo, chained = found["calls_plain"], found["calls_todo"], found["calls_chained"]
    assert len(plain) == len(todo) == len(chained) and [q for q, _ in todo] == [q for q, _ in plain]  # every query kept
    reduced = [(k, r) for (_, k), (_, r) in zip(plain, todo) if r != k]
    assert reduced, "no attention call had its keys reduced"
    for (q, k), (_, r), (_, c) in zip(plain, todo, chained):
        image = found["image_tokens"]  # the grid at a 32x32 latent (of 3 frames for video models)
        if k != q or k < image:  # cross-attention (text, CLIP image tokens) and text-only attention: untouched
            assert r == k == c
            continue
        assert r == k - image + image // 4, (q, k, r)  # kv_factor 2: a quarter of the image keys, every other key
        assert c == k - image + image // 16, (q, k, c)  # the chained node's kv_factor 4 replaced it


@each_model
def test_the_keys_dropped_are_the_latents_not_the_texts(comfyui, name):
    """Where the image sits, read from the model itself rather than from tokenmerge's layout: in the first attention
    over the grid, the key rows that another latent (same prompt) changes are the image's; every key todo drops is one
    of them (a layout read wrongly, as HunyuanVideo's text-first order in 0.33 was, drops text keys silently)."""
    found = comfyui["models"][name]
    latent, dropped = set(found["latent_rows"]), set(found["dropped_rows"])
    assert dropped and dropped <= latent, sorted(dropped - latent)[:8]


@each_model
def test_an_override_set_after_tokenmerges_is_chained_not_left_to_drop_it(comfyui, name):
    """ComfyUI keeps one ``optimized_attention_override`` (last writer wins): the core ModelAttentionBackend node or
    SageAttention after tokenmerge's node would drop the reduction silently; each call chains it instead."""
    found = comfyui["models"][name]
    assert found["calls_later"] == found["calls_todo"] != found["calls_plain"]


@each_model
def test_max_noise_leaves_the_noisy_step_whole_through_comfyuis_model_sampling(comfyui, name):
    found = comfyui["models"][name]
    plain, todo, scheduled = found["calls_plain"], found["calls_todo"], found["calls_scheduled"]
    half = len(plain) // 2  # two sampler steps, one model call each
    assert scheduled[:half] == plain[:half] and scheduled[half:] == todo[half:] != plain[half:]


@each_model
def test_autos_default_reduces_the_low_noise_step_the_bench_times(comfyui, name):
    """auto's default noise limit (0.4): the first step of an 11-step schedule (pure noise) keeps every key, the
    bench's step (the sigma at noise 0.25, found by bisection over the model's sampling) has its image keys reduced,
    every query kept."""
    found = comfyui["models"][name]
    plain, noisy, low = found["calls_plain_low"], found["calls_auto_noisy"], found["calls_auto_low"]
    assert abs(found["bench_noise"] - 0.25) < 1e-3
    assert noisy == plain and low != plain
    assert [q for q, _ in low] == [q for q, _ in plain] and all(k <= k0 for (_, k), (_, k0) in zip(low, plain))


@each_model
def test_autos_default_reduces_the_last_half_of_a_few_step_schedule(comfyui, name):
    """Four KSampler steps: auto's default reads the schedule from the sampler's sigmas and reduces steps 3 and 4
    (whatever their noise levels), keeping every key in steps 1 and 2 (tokenmerge.steps)."""
    found = comfyui["models"][name]
    plain, four = found["calls_plain"], found["calls_auto_four"]
    step = plain[: len(plain) // 2]  # one step of the plain run (two steps, one model call each)
    assert len(four) == 4 * len(step)
    per_step = [four[i * len(step) : (i + 1) * len(step)] for i in range(4)]
    assert per_step[0] == per_step[1] == step
    assert per_step[2] == per_step[3] != step


BLOCK_CASES = [(v, n) for v, n in CASES if get_family(comfy_examples()[n].family).comfy.blocks is not None]


@pytest.mark.parametrize("comfyui,name", BLOCK_CASES, indirect=["comfyui"])
def test_tome_merges_around_comfyuis_blocks_with_the_rotary_rows_following(comfyui, name):
    """``method="tome"`` through the block replace patches, over another node's (which then runs on the merged
    stream): identity bit-identical, every block's image tokens halved (text and references kept), deterministic, a
    second node replacing it; a plan that only reorders each sample's tokens gives the unpatched output, so each
    token's rotary row and residual follow it."""
    found = comfyui["models"][name]["tome"]
    image = comfyui["models"][name]["image_tokens"]
    assert found["plain_equal"] and found["identity_equal"] and found["replaced_equal"] and found["deterministic"]
    assert found["rel_l2"] > 1e-4 and found["permuted_rel_l2"] < 1e-5
    plain, tome = found["seen_plain"], found["seen_tome"]
    assert len(plain) == len(tome) and all(t == p - image // 2 for p, t in zip(plain, tome)), (plain, tome)


@pytest.mark.parametrize("comfyui,name", BLOCK_CASES, indirect=["comfyui"])
def test_tokencache_runs_through_comfyuis_blocks_with_every_tokens_keys(comfyui, name):
    """``method="tokencache"`` through the block replace patches (over another node's) and the attention override:
    identity bit-identical; steps 1-2 full, steps 3-6 recompute half of each block's image tokens (text and references
    whole); the recomputed queries get every image token's keys (an override set after tokenmerge's sees more keys than
    queries); a cached step on unchanged inputs equals the full step (keys, rotary rows and residuals each token's own);
    deterministic, its cache freed when the sampling run ends."""
    found = comfyui["models"][name]["tokencache"]
    image = comfyui["models"][name]["image_tokens"]
    assert found["plain_equal"] and found["identity_equal"] and found["deterministic"] and found["freed"]
    assert found["rel_l2"] > 1e-4 and found["unchanged_rel_l2"] < 1e-5
    plain, cache = found["seen_plain"], found["seen_cache"]
    per_step = len(plain) // STEPS
    assert len(plain) == len(cache) and cache[: 2 * per_step] == plain[: 2 * per_step]
    assert all(c == p - image // 2 for p, c in zip(plain[2 * per_step :], cache[2 * per_step :])), (plain, cache)
    calls = found["calls_later"]
    step = len(calls) // STEPS
    assert all(q == k or k < image for q, k in calls[: 2 * step]) and any(k - q == image // 2 for q, k in calls[2 * step :])


@each_version
def test_tokencache_through_the_samplers_and_chains_people_use(comfyui):
    """The samplers people use (ancestral, SDE, second-order, multistep, LCM) run deterministic and act; a cancelled
    prompt frees its cache and the same run after it equals it alone; KSamplerAdvanced's second half on another model
    equals that half alone; image 0 of a batch of two is the image made alone; weights changed between prompts (a LoRA)
    give the run with those weights alone; fp8 weight storage stays as close to its vanilla as fp32 does; a 4-step
    schedule is cached from its second step."""
    found = comfyui["workflows"]
    for sampler, run in found["samplers"].items():
        assert run["deterministic"] and run["finite"] and 1e-5 < run["rel_l2"] < 1.0, (sampler, run)
    assert found["cancelled_and_freed"] and found["after_cancel_equal"]
    # a 4-step schedule (the sampler's sigmas) is cached from its second step by the preset; full_steps given holds
    assert 1e-5 < found["few_step_rel_l2"] < 1.0 and found["few_step_given_equal"], found
    assert found["split_equal"] and found["batch_rel"] < 1e-4
    assert found["weights_changed_equal"] and found["weights_changed_differs"]
    assert 1e-5 < found["fp8_rel_l2"] <= 2 * found["fp32_rel_l2"] + 0.02, found


@each_version
def test_tokencache_after_comfyuis_torchcompilemodel_acts_as_uncompiled(comfyui):
    """TorchCompileModel after the tokenmerge node: its graphs keep no guards on transformer_options, so the blocks
    (which read and write the cache at every step) run outside them, said once; the outputs equal the uncompiled
    patch's over two generations and two sizes, within four compilations per code object."""
    found = comfyui["compiled"]
    assert found["acts"] > 1e-4 and all(rel < 1e-4 for rel in found["rel_l2"]), found
    assert len(found["said"]) == 1 and "TorchCompileModel" in found["said"][0], found["said"]


@each_version
def test_concurrent_calls_of_one_patched_model_each_get_their_own_grid(comfyui):
    assert comfyui["threads_equal"] and comfyui.get("threads_equal_wrapped", True)


@each_version
def test_the_unet_node_on_this_comfyui(comfyui):
    unet = comfyui["unet"]
    assert unet["identity_equal"] and unet["tome_rel_l2"] > 1e-4 and unet["todo_rel_l2"] > 1e-4


if __name__ == "__main__":  # the subprocess
    print(json.dumps(_worker(sys.argv[1], sys.argv[2], sys.argv[3].split(","))))


def test_zimage_finds_its_image_last_after_the_padded_caption():
    """ComfyUI's Z-Image pads the caption and the image each to a multiple of 32 ([caption + pad; image + pad]): the
    image starts after the padded caption, not after the text length the sampler passed (a wrong start would reduce
    caption padding as image rows, silently)."""
    from tokenmerge.families import get

    zimage = get("z-image").comfy
    n, text = 7 * 9, 40  # 63 image tokens (+1 pad), 40 caption tokens (+24 pad)
    assert zimage.image_start(64 + 64, n, text, pad=32) == 64  # the joint layers: after the padded caption
    assert zimage.image_start(64 + 256 + 64, n, text, pad=32) == 320  # an omni call: references before the image
    assert zimage.image_start(96, 64 * 64, 90, pad=32) is None  # the caption's refiner (96 = 90 padded)
    plain = get("lumina2").comfy
    assert plain.image_start(40 + 63, n, text) == 40  # Lumina 2: no padding, the image after the caption


def test_a_subclass_with_another_layout_is_not_claimed_by_its_parents_family():
    """LTX-2's ComfyUI class (``LTXAVModel``, video and audio in one packed latent) subclasses LTX-Video's: it is read
    by its own layout (the video stream), never by LTX-Video's through the MRO (``excludes``), which would take the
    packed latent for a video grid."""
    from tokenmerge.families import comfy_model_of

    LTXVModel = type("LTXVModel", (object,), {})
    LTXAVModel = type("LTXAVModel", (LTXVModel,), {})
    VaceWanModel = type("VaceWanModel", (type("WanModel", (object,), {}),), {})
    assert comfy_model_of(LTXVModel()).title == "LTX-Video"
    assert comfy_model_of(LTXAVModel()).title == "LTX-2" and "LTXAVModel" in get_family("ltx").comfy.excludes
    assert comfy_model_of(VaceWanModel()).title.startswith("Wan")  # a subclass of the same layout is claimed
