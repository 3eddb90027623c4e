"""Video transformers (Wan 2.x, CogVideoX): spatiotemporal grids, windows and factors, and what follows a merge.

The conformance suite covers every video example like any family (identity, removal, keys of the video only,
determinism, batches, pickling, compile). Here: the 3-D rotary rows a merged attention gets (against the tables
computed directly), the condition frame of Wan 2.2 TI2V never reduced, ``st`` and ``kv_factor=(t, h, w)``,
``auto``'s video rule, the pipelines (Wan 2.2's pair of experts; a whole sampling loop) and bad options.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import TokenGrid
from tokenmerge.methods import auto_kv_factors, merge_count
from tokenmerge.tools.architectures import build_model, transformer_inputs, transformer_output

from conftest import AttentionCalls, shared

TEXT = 5
LATENT = (18, 14)  # a 9x7 token grid per frame
FRAMES = 3


@pytest.fixture(scope="module")
def wan() -> torch.nn.Module:
    return shared(build_model("wan", small=True))


def _inputs(name: str, model: torch.nn.Module, frames: int = FRAMES, batch: int = 2, seed: int = 0) -> dict:
    return transformer_inputs(model, name, *LATENT, batch=batch, seed=seed, text_tokens=TEXT, frames=frames)


def _record_tables(model: torch.nn.Module, cls: str, argument: str, position: int | None, run) -> list:
    """The rotary tables ``cls``'s attentions receive during ``run()`` (hooks registered after the patch's)."""
    tables: list = []

    def record(module, args, kwargs):
        tables.append(kwargs[argument] if argument in kwargs else args[position])

    handles = [m.register_forward_pre_hook(record, with_kwargs=True) for m in model.modules() if type(m).__name__ == cls]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return tables


def test_wan_merged_tokens_take_their_destinations_3d_rotary_rows(wan, recorded_plans):
    inputs = _inputs("wan", wan)
    full_cos, full_sin = wan.rope(inputs["hidden_states"])  # (1, N, 1, D): the table the model builds
    with tokenmerge.patched(wan, ratio=0.5), torch.no_grad():
        tables = _record_tables(wan, "WanAttention", "rotary_emb", 3, lambda: wan(**inputs))
    tables = [t for t in tables if t is not None]  # attn1 (self) gets the table, attn2 (cross) None
    assert len(recorded_plans) == len(tables) == len(wan.blocks)
    for plan, (cos, sin) in zip(recorded_plans, tables):
        assert plan.batch_size == 2 and plan.num_tokens == FRAMES * 63  # a plan per sample
        for b, rows in enumerate(plan.keep_idx):  # the (1, N, 1, D) table: each sample's rows
            assert torch.equal(cos[b], full_cos[0, rows]) and torch.equal(sin[b], full_sin[0, rows])


def test_cogvideox_merged_tokens_take_their_destinations_3d_rotary_rows(recorded_plans):
    model = build_model("cogvideox", small=True)
    inputs = _inputs("cogvideox", model)
    full_cos, full_sin = inputs["image_rotary_emb"]  # (N_video, D), the pipeline's
    with tokenmerge.patched(model, ratio=0.5), torch.no_grad():
        tables = _record_tables(model, "Attention", "image_rotary_emb", None, lambda: model(**inputs))
    assert len(recorded_plans) == len(tables) == model.config.num_layers
    for plan, (cos, sin) in zip(recorded_plans, tables):
        # a table without a batch dimension: the attention is handed sample 0's rows, and SampleRows puts every
        # sample's in their place where it broadcasts them (each image's own result: the conformance suite)
        assert torch.equal(cos, full_cos[plan.keep_idx[0]]) and torch.equal(sin, full_sin[plan.keep_idx[0]])


@pytest.mark.parametrize("options", [dict(ratio=0.5), dict(method="todo", kv_factor=(2, 2, 2))], ids=["tome", "todo"])
def test_wan_ti2v_condition_frame_is_never_reduced(options, recorded_plans):
    """Wan 2.2 TI2V's per-token timestep marks its first latent frame as the clean image: its tokens keep every
    query and key (merges and downsampling act on the later frames only)."""
    model = build_model("wan-ti2v", small=True)
    inputs = _inputs("wan-ti2v", model)
    frame = 63
    with tokenmerge.patched(model, **options), AttentionCalls() as mode, torch.no_grad():
        model(**inputs)
    self_calls = [(q, k) for q, k, _ in mode.calls if k.shape[-2] != TEXT]
    if options.get("method") == "todo":
        later = math.ceil((FRAMES - 1) / 2) * 5 * 4  # the later frames' keys by (2, 2, 2)
        assert self_calls and all(k.shape[-2] == frame + later and q.shape[-2] == FRAMES * frame for q, k in self_calls)
    else:
        assert recorded_plans and all(p.num_tokens == (FRAMES - 1) * frame for p in recorded_plans)
        assert all(q.shape[-2] == FRAMES * frame - int((FRAMES - 1) * frame * 0.5) for q, _ in self_calls)


def test_kv_factor_tuple_downsamples_frames_too(wan):
    inputs = _inputs("wan", wan, frames=5)
    for factor, kept in ((2, 5 * 5 * 4), ((2, 2, 2), 3 * 5 * 4), ((1, 3, 3), 5 * 3 * 3), ((5, 1, 1), 63)):
        with tokenmerge.patched(wan, method="todo", kv_factor=factor), AttentionCalls() as mode, torch.no_grad():
            wan(**inputs)
        keys = {k.shape[-2] for q, k, _ in mode.calls if k.shape[-2] != TEXT}
        assert keys == {kept}, factor


def test_st_sets_the_frames_of_a_destination_window(wan):
    grid = TokenGrid((4, 8, 8))
    assert merge_count(tokenmerge.TokenMergeConfig(ratio=0.9, st=2), grid) == grid.numel - 32  # one destination per 2x2x2
    assert merge_count(tokenmerge.TokenMergeConfig(ratio=0.9), grid) == grid.numel - 64  # st=1: per frame
    inputs = _inputs("wan", wan, frames=4)
    outputs = []
    for st in (1, 2):
        with tokenmerge.patched(wan, ratio=0.5, st=st), torch.no_grad():
            outputs.append(transformer_output("wan", wan(**inputs)))
    assert not torch.equal(*outputs)
    with pytest.warns(UserWarning, match="does not use st=2"):
        tokenmerge.apply_patch(wan, method="todo", st=2)
    tokenmerge.remove_patch(wan)


def test_auto_rule_on_video_grids():
    # Wan 480p x 81 frames (21 x 30 x 52 tokens): every second frame's keys, each frame by 2 (1560 tokens > 1024).
    assert auto_kv_factors(TokenGrid((21, 30, 52)), 512, 1024) == (2, 2, 2)
    # HunyuanVideo 1.5 720p x 121 frames (31 x 45 x 80): each frame by 3.
    assert auto_kv_factors(TokenGrid((31, 45, 80)), 512, 1024) == (2, 3, 3)
    # Small frames: only the frames are thinned; a one-frame video follows the image rule; small grids stay.
    assert auto_kv_factors(TokenGrid((9, 16, 16)), 512, 1024) == (2, 1, 1)
    assert auto_kv_factors(TokenGrid((1, 64, 64)), 512, 1024) == (1, 3, 3)
    assert auto_kv_factors(TokenGrid((4, 8, 8)), 512, 1024) == (1, 1, 1)


def test_describe_names_the_video_factors(wan):
    with tokenmerge.patched(wan, method="auto"):
        text = str(tokenmerge.describe(wan, grid=(21, 30, 52)))
    assert "keys/values 32760 -> 4290 (factor 2x2x2, 21x30x52 -> 11x15x26)" in text


@pytest.mark.parametrize(
    "value,error",
    [((2, 2), ValueError), ((2, 0, 2), ValueError), ("2", TypeError), ((2.5, 2, 2), TypeError), (0, ValueError)],
)
def test_bad_kv_factor_names_the_argument(value, error):
    with pytest.raises(error, match="kv_factor must be an int >= 1 or a \\(t, h, w\\) tuple"):
        tokenmerge.TokenMergeConfig(method="todo", kv_factor=value)


def test_st_is_validated():
    with pytest.raises(ValueError, match="st must be an int >= 1"):
        tokenmerge.TokenMergeConfig(st=0)
    assert tokenmerge.TokenMergeConfig(method="todo", kv_factor=[1, 1, 1]).is_identity


def test_wan22_pipeline_patches_both_experts():
    import diffusers

    high, low = build_model("wan", small=True), build_model("wan", small=True, seed=1)
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=high, transformer_2=low)
    tokenmerge.apply_patch(pipe, method="auto")
    assert tokenmerge.get_config(high) is not None and tokenmerge.get_config(low) is not None
    tokenmerge.remove_patch(pipe)
    assert tokenmerge.get_config(high) is None and tokenmerge.get_config(low) is None


def test_wan_pipeline_whole_sampling_loop(wan):
    """WanPipeline's own loop (tiny VAE and scheduler, prompt embeddings given): patched, it runs its steps on the
    reduced blocks and its result differs from vanilla's but stays close; removed, it is vanilla's again."""
    import diffusers

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    pipe = diffusers.WanPipeline(
        tokenizer=None, text_encoder=None, vae=vae, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=wan
    )
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(0)
    text = torch.randn(1, TEXT, wan.config.text_dim, generator=g)

    def sample() -> torch.Tensor:
        return pipe(
            prompt_embeds=text,
            negative_prompt_embeds=torch.zeros_like(text),
            height=144,
            width=112,
            num_frames=9,
            num_inference_steps=2,
            generator=torch.Generator().manual_seed(1),
            output_type="latent",
        ).frames

    vanilla = sample()
    with tokenmerge.patched(pipe, method="auto", auto_max_keys=16, auto_min_tokens=16):
        patched = sample()
    assert patched.shape == vanilla.shape and not torch.equal(patched, vanilla)
    assert ((patched - vanilla).norm() / vanilla.norm()).item() < 0.5
    assert torch.equal(sample(), vanilla)


def test_a_per_token_timestep_keys_the_partition_by_the_step_not_the_condition_frame():
    from tokenmerge.algorithms import timestep_keys

    step = lambda value: torch.cat([torch.zeros(1, 4), torch.full((1, 8), value)], 1)  # noqa: E731 (frame 0 is clean)
    assert not torch.equal(
        timestep_keys(1, 2, step(900.0), 1, torch.device("cpu")), timestep_keys(1, 2, step(500.0), 1, torch.device("cpu"))
    )
    assert torch.equal(
        timestep_keys(1, 2, step(500.0), 1, torch.device("cpu")), timestep_keys(1, 2, torch.tensor([500.0]), 1, torch.device("cpu"))
    )


@pytest.mark.parametrize("options", [dict(ratio=0.5, st=2), dict(method="todo", kv_factor=(2, 2, 2))], ids=["st", "kv_factor"])
def test_frame_options_on_an_image_model_are_said_once_at_the_patch(options):
    """Said by apply_patch with the value in effect, not by every block at the first call."""
    model = build_model("pixart", small=True)
    inputs = transformer_inputs(model, "pixart", 16, 16, batch=1, text_tokens=TEXT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tokenmerge.patched(model, **options), torch.no_grad():
            said_at_patch = [str(w.message) for w in caught]
            model(**inputs)
    found = [str(w.message) for w in caught if "frames" in str(w.message)]
    assert len(found) == 1 and found == [m for m in said_at_patch if "frames" in m]
    assert "token grids of the PixArt" in found[0] and "have none" in found[0] and "in effect" in found[0]
