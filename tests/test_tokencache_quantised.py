"""The token cache on quantised and offloaded models, as GPU users run them: torchao int8 weight-only, fp8 weight
storage (diffusers' ``enable_layerwise_casting``), diffusers' GGUF loader (a GGUF file written here with the ``gguf``
package), group offloading and ``enable_model_cpu_offload``.

Each on a 32-wide Flux.1 transformer (quantised kernels need rows of 32): the cache acts, and its output is as close to
the quantised model's vanilla output as the unquantised cache is to vanilla (within a factor 2 and 0.01). Skipped with
the reason where a package is missing.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import at_noise, timestep_scale, transformer_inputs, transformer_output

OPTIONS = dict(method="tokencache", recompute=0.25, full_steps=1, refresh_every=3)
CONFIG = dict(
    patch_size=1,
    in_channels=32,
    num_layers=1,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=False,
    axes_dims_rope=(4, 6, 6),
)


def _model() -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(**CONFIG).eval()


def _calls(model: torch.nn.Module) -> list[dict]:
    base = transformer_inputs(model, "flux", 16, 12, batch=1, seed=0, text_tokens=5)
    found = []
    for i, level in enumerate(torch.linspace(1.0, 0.2, 6).tolist()):
        inputs = at_noise(base, timestep_scale(model), level)
        inputs["hidden_states"] = base["hidden_states"] * (1 - 0.03 * i)
        found.append(inputs)
    return found


def _run(model: torch.nn.Module, calls: list[dict], **options) -> list[torch.Tensor]:
    context = tokenmerge.patched(model, **options) if options else torch.no_grad()
    with context, torch.no_grad():
        return [transformer_output("flux", model(**c)).float() for c in calls]


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b))


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (.ci/run installs it)")


def _torchao_int8(model: torch.nn.Module) -> torch.nn.Module:
    _needs("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())
    return model


def _fp8_storage(model: torch.nn.Module) -> torch.nn.Module:
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    return model


def _gguf(model: torch.nn.Module, tmp_path) -> torch.nn.Module:
    """The model written to a GGUF file (Q8_0 where a row holds whole blocks of 32, float32 elsewhere) and loaded back
    through diffusers' single-file GGUF loader (its weights GGUFParameters, dequantised at each call)."""
    _needs("gguf")
    import gguf
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    model.save_config(tmp_path)
    path = tmp_path / "transformer.gguf"
    writer = gguf.GGUFWriter(str(path), "flux")
    for name, value in model.state_dict().items():
        array = value.float().numpy()
        if array.ndim == 2 and array.shape[-1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = FluxTransformer2DModel.from_single_file(
        str(path), config=str(tmp_path), quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32)
    )
    assert type(loaded.transformer_blocks[0].attn.to_q.weight).__name__ == "GGUFParameter"
    return loaded.eval()


def _group_offload(model: torch.nn.Module) -> torch.nn.Module:
    cpu = torch.device("cpu")
    model.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1)
    return model


QUANTISED = {"torchao-int8": _torchao_int8, "fp8-storage": _fp8_storage, "gguf-q8_0": _gguf, "group-offload": _group_offload}


@pytest.mark.parametrize("kind", QUANTISED)
def test_the_token_cache_acts_on_quantised_and_offloaded_models(kind, tmp_path):
    reference = _model()
    calls = _calls(reference)
    vanilla, cached = _run(reference, calls), _run(reference, calls, **OPTIONS)
    error = _relative(cached, vanilla)
    make = QUANTISED[kind]
    model = make(_model(), tmp_path) if kind == "gguf-q8_0" else make(_model())
    quantised_vanilla = _run(model, calls)
    assert _relative(quantised_vanilla, vanilla) < 0.2  # (the quantised model is the same model)
    quantised_cached = _run(model, calls, **OPTIONS)
    found = _relative(quantised_cached, quantised_vanilla)
    assert 1e-4 < found <= 2 * error + 0.01, (found, error)
    assert all(torch.equal(a, b) for a, b in zip(quantised_cached[:2], quantised_vanilla[:2]))  # its full steps


def test_the_token_cache_in_a_pipeline_with_model_cpu_offload():
    """``enable_model_cpu_offload`` (accelerate's hooks on each component, here onto the CPU itself): a token-cache
    generation runs, acts, and equals the same generation without offloading."""
    _needs("accelerate")
    from test_transformer_pipelines import flux_pipeline

    def generate(offload: bool) -> torch.Tensor:
        pipe, call = flux_pipeline(False)
        pipe.set_progress_bar_config(disable=True)
        if offload:
            pipe.enable_model_cpu_offload(device="cpu")
        tokenmerge.apply_patch(pipe, **OPTIONS)
        generator = torch.Generator().manual_seed(0)
        return pipe(num_inference_steps=6, height=64, width=64, generator=generator, output_type="latent", **call).images

    plain, offloaded = generate(False), generate(True)
    assert torch.equal(plain, offloaded)
