"""``tokenmerge bench`` end to end, on the narrow SD 1.5 variant."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tokenmerge.tools.cli import main


def test_bench_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--small", "--sizes", "128", "--repeats", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "vanilla" in table and "tomesd 0.1.3 r=0.5" in table and "tokenmerge r=0.5" in table
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == {"vanilla", "tomesd 0.1.3 r=0.5", "tokenmerge r=0.5", "tokenmerge auto"}
    vanilla = next(r for r in rows if r["variant"] == "vanilla")
    assert vanilla["speedup"] == 1.0 and vanilla["rel_l2"] == 0.0
    ours = next(r for r in rows if r["variant"] == "tokenmerge r=0.5")
    assert 0 < ours["rel_l2"] < 0.5 and ours["median_s"] > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--sizes", "500"],
        ["bench", "--model", "sd4"],
        ["bench", "--small", "--blocks", "2"],
        ["bench", "--model", "sd3", "--small", "--variants", "tomesd:0.5"],
    ],
)
def test_bench_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as error:
        main(argv)
    assert "tokenmerge bench: error" in capsys.readouterr().err + str(error.value.code)


def test_bench_variants_sizes_memory_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "bench.json", tmp_path / "speedup.png"
    argv = ["bench", "--small", "--sizes", "64", "128", "--repeats", "1", "--json", str(out), "--plot", str(plot)]
    assert main([*argv, "--variants", "todo:2", "tome:0.5,share_plan=true", "tome:0.5,match_dtype=bfloat16"]) == 0
    captured = capsys.readouterr()
    assert "128 px: about" in captured.err  # time estimate from the previous size
    rows = json.loads(out.read_text())["rows"]
    names = ["vanilla", "tokenmerge todo f=2", "tokenmerge r=0.5 share_plan=True", "tokenmerge r=0.5 match_dtype=bfloat16"]
    assert [r["variant"] for r in rows] == names * 2
    assert all(r["peak_mem_mb"] >= 0 for r in rows)
    assert plot.stat().st_size > 1000


def test_bench_rejects_a_bad_variant():
    with pytest.raises(SystemExit, match="--variants: .*reuse_steps"):
        main(["bench", "--small", "--variants", "tome:0.5,reuse_steps=0"])


@pytest.mark.parametrize("model", ["sd3", "sd35", "flux", "pixart"])
def test_bench_runs_the_transformers_with_their_attention_share(model, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", model, "--small", "--sizes", "64", "--repeats", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "image attention:" in table and "ceiling of attention-only speed-ups" in table
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["vanilla", "tokenmerge r=0.5", "tokenmerge auto"]
    assert 0 < rows[0]["attention_share"] < 1 and rows[1]["rel_l2"] > 0


def test_bench_labels_a_transformer_with_fewer_blocks(capsys):
    assert main(["bench", "--model", "flux", "--small", "--blocks", "1", "--sizes", "64", "--repeats", "0", "--variants", "auto"]) == 0
    assert "its first blocks at full width (num_layers=1, num_single_layers=2)" in capsys.readouterr().out


def test_bench_whole_sampling_loops_with_accelerators(tmp_path, capsys):
    pytest.importorskip("DeepCache")
    out = tmp_path / "bench.json"
    argv = ["bench", "--small", "--steps", "3", "--sizes", "128", "--repeats", "0", "--json", str(out)]
    assert main([*argv, "--variants", "deepcache", "auto+deepcache", "tome:0.5+freeu", "tome:0.5+slicing"]) == 0
    table = capsys.readouterr().out
    assert "whole sampling loops of 3 DDIM steps" in table and "median s/run" in table
    rows = json.loads(out.read_text())["rows"]
    names = ["vanilla", "DeepCache", "tokenmerge auto + DeepCache", "tokenmerge r=0.5 + FreeU", "tokenmerge r=0.5 + attention slicing"]
    assert [r["variant"] for r in rows] == names
    assert all(r["rel_l2"] > 0 for r in rows[1:])


@pytest.mark.parametrize("spec,error", [("auto+turbo", "unknown accelerator"), ("auto+tome:0.5+dbcache", "more than one method")])
def test_bad_accelerator_specs(spec, error):
    from tokenmerge.tools.specs import PatchSpec

    with pytest.raises(ValueError, match=error):
        PatchSpec.parse(spec)


def test_accelerators_may_come_first():
    from tokenmerge.tools.specs import PatchSpec

    assert PatchSpec.parse("dbcache+tome:0.5") == PatchSpec.parse("tome:0.5+dbcache")
    assert PatchSpec.parse("dbcache").method == "none" and PatchSpec.parse("dbcache").caches == ("dbcache",)


def test_bench_whole_transformer_loops_with_step_caches(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "flux", "--small", "--batch", "1", "--steps", "4", "--sizes", "128", "--repeats", "0"]
    assert main([*argv, "--json", str(out), "--variants", "taylorseer", "auto+taylorseer", "tome:0.5+magcache"]) == 0
    table = capsys.readouterr().out
    assert "whole sampling loops of 4 flow-matching Euler steps" in table and "median s/run" in table
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["vanilla", "TaylorSeer", "tokenmerge auto + TaylorSeer", "tokenmerge r=0.5 + MagCache"]
    assert all(r["rel_l2"] > 0 for r in rows[1:])


@pytest.mark.parametrize(
    "argv,error",
    [
        (["--model", "flux", "--variants", "auto+deepcache"], "act on a UNet pipeline"),
        (["--variants", "auto+fbcache"], "act on transformers"),
    ],
)
def test_accelerators_for_the_other_kind_of_model_are_refused(argv, error):
    with pytest.raises(SystemExit, match=error):
        main(["bench", "--small", "--steps", "2", "--sizes", "128", *argv])


def test_accelerators_need_whole_sampling_loops(capsys):
    with pytest.raises(SystemExit, match="add --steps N"):
        main(["bench", "--small", "--variants", "auto+deepcache"])


@pytest.mark.parametrize("argv", [["--batch", "3"], ["--steps", "4", "--batch", "2"]])
def test_bench_comfyui_transformers_sample_at_cfg_1_or_2(argv):
    """ComfyUI's DiT bench: its batch is the sampler's (CFG 2: both halves in one call; CFG 1: the conditional alone),
    and its whole loops run at CFG 1 as the diffusers loops do."""
    with pytest.raises(SystemExit, match="CFG 2"):
        main(["bench", "--comfyui", "--model", "flux", *argv])


def test_bench_rows_are_measured_against_their_own_baseline():
    """--beside-diffusers: a second model's rows in the same rounds take their speed-up, work and fidelity from their
    own vanilla, not from the first model's."""
    import torch

    from tokenmerge.tools.bench import Variant, time_variants

    def model(scale: float, width: int):
        return lambda inputs: torch.nn.functional.linear(inputs["x"][:, :width], torch.eye(width)).sum(1) * scale

    variants = [
        Variant("vanilla", model(1.0, 64)),
        Variant("half", model(1.0, 32)),
        Variant("other vanilla", model(2.0, 16), baseline="other vanilla"),
        Variant("other half", model(2.0, 8), baseline="other vanilla"),
    ]
    rows = time_variants(variants, {64: lambda: {"x": torch.ones(4, 64)}}, repeats=1, log=lambda _: None)
    by = {r.variant: r for r in rows}
    assert by["other vanilla"].speedup == 1.0 and by["other vanilla"].less_work == 1.0 and by["other vanilla"].cosine == 1.0
    assert by["half"].less_work == 4.0 and by["other half"].less_work == 4.0  # (64 / 32)^2 and (16 / 8)^2


def test_bench_beside_diffusers_goes_with_a_comfyui_transformer():
    with pytest.raises(SystemExit, match="--beside-diffusers goes with --comfyui"):
        main(["bench", "--model", "flux", "--beside-diffusers"])


def test_bench_video_latents_are_the_same_on_both_front_ends():
    """A video bench size in pixels gives the same latent grid on the diffusers path and ComfyUI's: each model's VAE
    factor (Wan 2.2 TI2V's 16, LTX's 32) once on each side."""
    from tokenmerge.tools.examples import comfy_examples, examples

    both = {name: (comfy, examples()[name][1]) for name, comfy in comfy_examples().items() if comfy.video and name in examples()}
    assert {"wan", "wan-ti2v", "ltx", "hunyuanvideo15"} <= set(both)
    assert {name: comfy.downscale for name, (comfy, _) in both.items()} == {name: e.vae_factor for name, (_, e) in both.items()}


@pytest.mark.parametrize("attention", ["default", "pytorch"])
def test_bench_comfyui_reports_the_attention_share_only_where_it_times_attention(attention):
    # ComfyUI's default CPU attention (sub-quadratic) does not go through SDPA: no share can be measured there.
    # A subprocess each: ComfyUI chooses its attention backend once per process, at import.
    argv = ["bench", "--comfyui", "--comfy-attention", attention, "--small", "--sizes", "128", "--repeats", "0"]
    code = f"from tokenmerge.tools.cli import main; raise SystemExit(main({argv!r}))"
    table = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "tokenmerge node r=0.5" in table and "ComfyUI TomePatchModel" in table
    assert ("image attention:" in table) == (attention == "pytorch")


def test_bench_tables_say_what_is_within_their_noise():
    """The quick start's case: auto above the printed ceiling and ranges that contain vanilla's are called noise."""
    from tokenmerge.tools.bench import Row, format_table

    rows = [
        Row(512, "vanilla", 23.0, 1.0, 1.0, 0.0, 0, 22.04, 24.31, attention_share=0.14),
        Row(512, "tomesd r=0.5", 37.0, 0.62, 1.0, 0.0, 0, 30.0, 44.0),
        Row(512, "tokenmerge auto", 16.9, 1.36, 1.0, 0.0, 0, 9.54, 24.43),
        Row(512, "tokenmerge r=0.5", 15.0, 1.53, 1.0, 0.0, 0, 14.5, 15.5),
    ]
    text = format_table(rows, "sd15 UNet", 2, rounds=2)
    assert "within the noise measured (min-max overlaps vanilla's): tokenmerge auto\n" in text + "\n"
    assert "above the attention-only ceiling 1.16x, so partly noise: tokenmerge auto" in text
    assert "2 timed round(s) per variant" in text and "not image quality" in text


def test_bench_summary_puts_each_size_beside_its_target(tmp_path):
    import json

    from tokenmerge.tools.bench_summary import summary

    def row(px, variant, median, speedup, lo, hi, share=None):
        return dict(size_px=px, variant=variant, median_s=median, speedup=speedup, min_s=lo, max_s=hi, attention_share=share)

    rows = [
        row(1024, "vanilla", 10.0, 1.0, 9.8, 10.2, 0.2),
        row(1024, "tokenmerge r=0.5", 5.0, 2.0, 4.9, 5.1),
        row(1024, "tokenmerge auto", 8.4, 1.19, 8.3, 8.5),
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"meta": {"argv": ["bench", "--model", "qwen-image", "--blocks", "2"]}, "rows": rows}))
    line = summary([str(path)]).splitlines()[-1]
    assert line.startswith("| qwen-image (2) | 1024 | 10.0 (9.8-10.2) | 20% | 1.25x | 2.00x")
    assert "76% | auto >= 1.21x: no; tome >= 1.5x: yes |" in line


@pytest.mark.parametrize(
    ("mode", "extra", "variants"),
    [("model", [], ["tome:0.5", "todo:2"]), ("blocks", [], ["tome:0.5", "todo:2"]), ("blocks", ["--steps", "2"], ["todo:2+fbcache"])],
)
def test_bench_compiles_the_model_or_its_blocks_and_every_variant_acts(mode, extra, variants, tmp_path, monkeypatch):
    """--compile runs every variant through one compiled model, patched for its own calls: each patched row differs
    from vanilla (dynamo guards on the hooks, else the graph traced first would run for all). Dynamo's eager backend
    stands in for inductor: what is checked is the tracing, not the kernels."""
    import torch

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: real(*args, **{**kwargs, "backend": "eager"}))
    config = torch._dynamo.config
    kept = {name: getattr(config, name) for name in ("skip_nnmodule_hook_guards", "recompile_limit", "accumulated_recompile_limit")}
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "flux", "--small", "--batch", "1", "--sizes", "128", "--repeats", "0", "--compile", mode, *extra]
    try:
        with config.patch(kept):  # the bench sets them for its process
            assert main([*argv, "--json", str(out), "--variants", *variants]) == 0
    finally:
        torch._dynamo.reset()
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 + len(variants) and all(r["variant"].endswith(f"(compiled {mode})") for r in rows)
    assert all(r["rel_l2"] > 0 for r in rows[1:])


@pytest.mark.parametrize(
    ("argv", "error"),
    [(["--compile", "--steps", "2"], "compiles block by block"), (["--model", "sd3", "--compile", "blocks"], "no repeated blocks")],
)
def test_bench_refuses_a_compile_it_cannot_do(argv, error):
    with pytest.raises(SystemExit, match=error):
        main(["bench", "--small", "--sizes", "128", "--repeats", "0", *argv])


def test_version_and_a_bare_command_say_what_tokenmerge_is(capsys):
    from tokenmerge import __version__

    with pytest.raises(SystemExit) as error:
        main(["--version"])
    assert error.value.code == 0 and capsys.readouterr().out.strip() == f"tokenmerge {__version__}"
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Training-free token reduction for diffusion models" in out and "describe" in out and "bench" in out


def test_describe_a_family_at_a_size_in_pixels(capsys):
    assert main(["describe", "wan", "--size", "480x832", "--frames", "81", "--config", "auto"]) == 0
    out = capsys.readouterr().out
    assert "WanTransformer3DModel (Wan 2.1 / 2.2): 30 of 30 blocks patched, method=auto, at a 21x30x52 token grid" in out
    assert "factor 2x2x2" in out  # 480p: every second frame, 2 per side


def test_describe_a_diffusers_folder_counts_the_steps_its_scheduler_reduces(tmp_path, capsys):
    """A folder's configs only (the transformer built on the meta device): Flux.1 at 1024 px, 28 steps, auto's default."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from tokenmerge.tools.architectures import build_model

    (tmp_path / "transformer").mkdir()
    build_model("flux", small=True).save_config(tmp_path / "transformer")
    FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15
    ).save_pretrained(tmp_path / "scheduler")
    index = {"_class_name": "FluxPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}
    index |= {"transformer": ["diffusers", "FluxTransformer2DModel"], "vae": [None, None]}
    index |= {key: [None, None] for key in ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    assert main(["describe", str(tmp_path), "--size", "1024", "--steps", "28"]) == 0
    assert "steps: reduces 4 of 28 (steps 25-28)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["eval", "--model", "no/such/folder"], "tokenmerge eval: error: --model must be one of"),
        (["describe", "sd4"], "tokenmerge describe: error:"),
        (["describe", "flux", "--steps", "28"], "give a diffusers folder"),
    ],
)
def test_a_missing_model_is_a_usage_error_not_a_traceback(argv, message):
    with pytest.raises(SystemExit) as error:
        main(argv)
    assert message in str(error.value.code)
