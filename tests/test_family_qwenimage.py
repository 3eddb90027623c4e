"""Qwen-Image: edit references kept whole, the rotary image table gathered at the kept rows, how a call's layout is
read (img_shapes per sample, flat, mixed), Edit 2511's zero_cond_t, Layered, the ControlNet, gradient checkpointing,
and Qwen-Image 2.1's refusal."""

from __future__ import annotations

import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import nearest_indices
from tokenmerge.families import family_of, get
from tokenmerge.families.base import DECLINED
from tokenmerge.tools.architectures import build_model
from tokenmerge.tools.examples import of_family
from tokenmerge.tools.examples.qwenimage import CONFIG, SMALL
from tokenmerge.tools.examples.qwenimage import inputs as qwen_inputs

from conftest import AttentionCalls, shared

LATENT = (12, 10)  # a 6x5 target grid
REFERENCE = (4, 3)  # one edit reference of 4x3 tokens
TEXT = 5
TARGET, REF = 30, 12


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return shared(build_model("qwen-image", small=True))


def edit_inputs(model: torch.nn.Module, batch: int = 2, pad: bool = False) -> dict:
    found = qwen_inputs(model, *LATENT, batch=batch, seed=0, text_tokens=TEXT, references=(REFERENCE,))
    if pad:  # the second prompt two tokens shorter, as the pipelines pad a batch of prompts
        mask = torch.ones(batch, TEXT, dtype=torch.long)
        mask[-1, -2:] = 0
        found["encoder_hidden_states_mask"] = mask
    return found


def run(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, list]:
    mode = AttentionCalls()
    with torch.no_grad(), mode:
        out = model(**inputs)[0]
    return out, mode.calls


def layout_of(model: torch.nn.Module, inputs: dict):
    (state,) = [s for _, s in tokenmerge.hooks.states_in([model])]
    return state.layout.containers[0].layout((), inputs)


def test_an_edit_call_is_text_target_then_its_reference():
    model = build_model("qwen-image", small=True)
    with tokenmerge.patched(model, ratio=0.5):
        layout = layout_of(model, edit_inputs(model))
    assert [s.kind for s in layout.segments] == ["text", "image", "reference"]
    assert [s.length for s in layout.segments] == [TEXT, TARGET, REF]
    assert layout.grid.shape == (6, 5) and [g.shape for g in layout.references] == [(4, 3)]
    assert layout.stream("image").total == TARGET + REF


@pytest.mark.parametrize("pad", [False, True])
def test_todo_reduces_the_target_keys_only_and_leaves_the_reference_keys_as_vanilla(model, pad):
    inputs = edit_inputs(model, pad=pad)
    _, vanilla = run(model, inputs)
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        grid = layout_of(model, inputs).grid
        _, patched = run(model, inputs)
    keep = nearest_indices(grid, (2, 2), "nearest-exact", torch.device("cpu"))
    assert len(patched) == len(vanilla) == len(model.transformer_blocks)
    for (q0, k0, _), (q, k, _) in zip(vanilla, patched):
        assert q.shape == q0.shape and k0.shape[-2] == TEXT + TARGET + REF
        assert k.shape[-2] == TEXT + keep.numel() + REF
    (_, k0, m0), (_, k, m) = vanilla[0], patched[0]
    target = k0[..., TEXT : TEXT + TARGET, :].index_select(-2, keep)
    assert torch.equal(k, torch.cat([k0[..., :TEXT, :], target, k0[..., TEXT + TARGET :, :]], dim=-2))
    assert torch.equal(k[..., -REF:, :], k0[..., -REF:, :])  # the reference's keys, exactly vanilla's
    if pad:  # the text mask's columns follow the keys
        columns = m0[..., TEXT : TEXT + TARGET].index_select(-1, keep)
        assert torch.equal(m, torch.cat([m0[..., :TEXT], columns, m0[..., TEXT + TARGET :]], dim=-1))
        assert not m[-1, ..., TEXT - 2 : TEXT].any() and m[..., TEXT:].all()
    else:
        assert m0 is None and m is None


@pytest.mark.parametrize("pad", [False, True])
def test_tome_merges_target_tokens_only(model, pad):
    inputs = edit_inputs(model, pad=pad)
    _, vanilla = run(model, inputs)
    with tokenmerge.patched(model, ratio=0.5):
        _, patched = run(model, inputs)
    r = int(TARGET * 0.5)
    for (q0, _, _), (q, k, _) in zip(vanilla, patched):
        assert q.shape[-2] == k.shape[-2] == q0.shape[-2] - r == TEXT + TARGET - r + REF
    (q0, _, _), (q, _, _) = vanilla[0], patched[0]
    assert torch.equal(q[..., :TEXT, :], q0[..., :TEXT, :])  # text untouched
    torch.testing.assert_close(q[..., -REF:, :], q0[..., -REF:, :], rtol=0, atol=1e-6)  # reference at its own positions


def test_the_rotary_image_table_is_gathered_at_the_kept_rows(model):
    inputs = edit_inputs(model)
    attn = model.transformer_blocks[0].attn
    seen: dict = {}

    def grab(module, args, kwargs):  # what the processor gets
        seen["rotary"] = kwargs["image_rotary_emb"]
        seen["tokens"] = kwargs["hidden_states"].shape[1]
        states = [s for _, s in tokenmerge.hooks.states_in([model])]
        seen["plan"] = states[0].current().blocks[0].action.plan if states else None

    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        run(model, inputs)
    finally:
        handle.remove()
    image0, text0 = seen["rotary"]
    with tokenmerge.patched(model, ratio=0.5):
        handle = attn.register_forward_pre_hook(grab, with_kwargs=True)  # after the patch's pre-hooks
        try:
            run(model, inputs)
        finally:
            handle.remove()
    # vanilla's table: one row per token of the image stream (target, then reference), no batch dimension
    expected_image, _ = model.pos_embed(inputs["img_shapes"], max_txt_seq_len=TEXT, device=torch.device("cpu"))
    assert torch.equal(image0, expected_image) and image0.shape[0] == TARGET + REF and image0.is_complex()
    plan = seen["plan"]
    assert plan.keep_idx.shape[1] == TARGET - TARGET // 2  # the table has no batch dimension: the attention gets sample 0's rows
    rows = torch.cat([plan.keep_idx[0], TARGET + torch.arange(REF)])  # kept target rows in merged order, reference whole
    image, text = seen["rotary"]
    assert torch.equal(image, image0[rows]) and torch.equal(text, text0) and text.shape[0] == TEXT
    assert seen["tokens"] == rows.numel()


def test_a_batch_whose_samples_have_different_img_shapes_runs_unchanged(model):
    inputs = qwen_inputs(model, *LATENT, batch=2, seed=1, text_tokens=TEXT)
    inputs["img_shapes"] = [[(1, 6, 5)], [(1, 5, 6)]]  # the model's rotary table comes from the first sample only
    vanilla, _ = run(model, inputs)
    with tokenmerge.patched(model, ratio=0.5):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, _ = run(model, inputs)
            run(model, inputs)
        assert layout_of(model, inputs) is DECLINED
    assert torch.equal(out, vanilla)
    # One warning saying why, not one per block or per call.
    assert [str(w.message) for w in caught if "tokenmerge" in str(w.message)] == [
        f"tokenmerge: Qwen-Image: the samples of a batch have different img_shapes ({inputs['img_shapes']!r}); such calls run unchanged"
    ]


def test_flat_img_shapes_are_one_segment_per_sample(model):
    inputs = qwen_inputs(model, *LATENT, batch=2, seed=2, text_tokens=TEXT)
    inputs["img_shapes"] = [(1, 6, 5)] * 2  # the controlnet-inpaint pipeline's form
    _, vanilla = run(model, inputs)
    with tokenmerge.patched(model, ratio=0.5):
        layout = layout_of(model, inputs)
        _, patched = run(model, inputs)
    assert layout.grid.shape == (6, 5) and not layout.references
    assert all(q.shape[-2] == q0.shape[-2] - TARGET // 2 for (q0, _, _), (q, _, _) in zip(vanilla, patched))


def test_img_shapes_that_miss_tokens_run_unchanged(model):
    inputs = qwen_inputs(model, *LATENT, batch=1, seed=3, text_tokens=TEXT)
    inputs["img_shapes"] = [[(1, 5, 5)]]
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        with pytest.warns(UserWarning, match="do not add up"):
            assert layout_of(model, inputs) is DECLINED


@pytest.mark.parametrize("options", [dict(ratio=0.5), dict(method="todo", kv_factor=2)])
def test_edit_2511_zero_cond_t_with_a_reference(options):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**{**CONFIG, **SMALL}, zero_cond_t=True).eval()
    inputs = edit_inputs(model)
    vanilla, _ = run(model, inputs)
    with tokenmerge.patched(model, ratio=0.0):
        assert torch.equal(run(model, inputs)[0], vanilla)
    with tokenmerge.patched(model, **options):
        out, calls = run(model, inputs)
    assert out.shape == vanilla.shape and torch.isfinite(out).all() and not torch.equal(out, vanilla)
    assert all(k.shape[-2] < TEXT + TARGET + REF for _, k, _ in calls)


def test_layered_reduces_the_first_layer_only():
    """Layered: img_shapes [layer 0; other layers; condition image], layered rotary: everything after layer 0 keeps
    its keys."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    config = {**CONFIG, **SMALL, "use_layer3d_rope": True, "use_additional_t_cond": True}
    model = QwenImageTransformer2DModel(**config).eval()
    inputs = qwen_inputs(model, *LATENT, batch=2, seed=5, text_tokens=TEXT, references=((6, 5), (4, 4)))
    inputs["additional_t_cond"] = torch.zeros(2, dtype=torch.long)  # the pipeline's is_rgb
    _, vanilla = run(model, inputs)
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        layout = layout_of(model, inputs)
        _, patched = run(model, inputs)
    assert [s.kind for s in layout.segments] == ["text", "image", "reference", "reference"]
    (_, k0, _), (_, k, _) = vanilla[0], patched[0]
    rest = TARGET + 16
    assert k.shape[-2] == TEXT + 9 + rest and torch.equal(k[..., -rest:, :], k0[..., -rest:, :])


def test_the_controlnet_is_patched_like_the_transformer():
    from diffusers import QwenImageControlNetModel

    torch.manual_seed(0)
    config = {**CONFIG, **SMALL}
    controlnet = QwenImageControlNetModel(**{k: v for k, v in config.items() if k != "guidance_embeds"}).eval()
    assert family_of(controlnet) is get("qwen-image")
    inputs = qwen_inputs(controlnet, *LATENT, batch=2, seed=4, text_tokens=TEXT)
    for name in ("guidance", "attention_kwargs"):
        inputs.pop(name)
    inputs["controlnet_cond"] = torch.randn_like(inputs["hidden_states"])
    _, vanilla = run(controlnet, inputs)
    with tokenmerge.patched(controlnet, method="todo", kv_factor=2):
        _, patched = run(controlnet, inputs)
    assert [k.shape[-2] for _, k, _ in vanilla] == [TEXT + TARGET] * len(controlnet.transformer_blocks)
    assert [k.shape[-2] for _, k, _ in patched] == [TEXT + 3 * 3] * len(controlnet.transformer_blocks)


@pytest.mark.parametrize("options", [dict(method="todo", kv_factor=2), dict(ratio=0.5)])
def test_gradient_checkpointing_calls_blocks_positionally_and_gives_the_same_gradients(options):
    model = build_model("qwen-image", small=True)
    inputs = edit_inputs(model)
    grads = []
    with tokenmerge.patched(model, **options):
        for checkpointing in (False, True):
            if checkpointing:
                model.enable_gradient_checkpointing()
            x = inputs["hidden_states"].clone().requires_grad_()
            model(**{**inputs, "hidden_states": x})[0].square().mean().backward()
            grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_qwen_image_21_is_refused_with_its_reason():
    from diffusers import QwenImage21Transformer2DModel

    model = QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        context_in_dim=8,
        mlp_ratio=2,
        axes_dims_rope=(4, 6, 6),
    )
    family = family_of(model)
    assert family is get("qwen-image-2.1") and family.layout is None and not of_family("qwen-image-2.1")
    with pytest.raises(
        TypeError,
        match=r"QwenImage21Transformer2DModel \(Qwen-Image 2\.1\): not supported yet: its attention is block-causal .* "
        r"whose queries attend in a call of their own",
    ):
        tokenmerge.apply_patch(model, method="auto")
    assert tokenmerge.get_config(model) is None
