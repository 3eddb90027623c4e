"""Chroma and HiDream-I1: what the conformance suite does not see.

Chroma: the pipeline's float text mask (B, T + N) becomes a (B, 1, S, S) mask at every attention; under ToMe its
rows and columns follow the merge, under ToDo its columns follow the downsampled keys. HiDream: non-square latents
are padded to ``max_seq`` with a mask (the padding is a segment of its own, never reduced, and the mask follows a
merge); the text is T5 + 2 x Llama tokens; the rotary table has a batch axis and is gathered per sample; calls
with pre-patchified inputs run unchanged. The text is never reduced in either.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import TokenGrid, nearest_indices
from tokenmerge.tools.architectures import build_model, transformer_inputs, transformer_output

from conftest import AttentionCalls, shared

TEXT = 5
LATENT = (18, 14)  # a 9x7 token grid
GRID = TokenGrid((9, 7))
KEPT = nearest_indices(GRID, (2, 2), "nearest-exact", torch.device("cpu")).numel()  # 20 keys of 63
MERGED = int(GRID.numel * 0.5)  # tokens ToMe removes at ratio 0.5
METHODS = {"tome": dict(ratio=0.5), "todo": dict(method="todo", kv_factor=2)}


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: shared(build_model(name, small=True)) for name in ("chroma", "hidream")}


def run(name: str, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return transformer_output(name, model(**inputs))


def attention_calls(name: str, model: torch.nn.Module, inputs: dict) -> list:
    mode = AttentionCalls()
    with mode:
        run(name, model, inputs)
    return mode.calls


# -- Chroma ------------------------------------------------------------------------------------------------------
def chroma_inputs(model: torch.nn.Module, batch: int = 2, seed: int = 0) -> dict:
    inputs = transformer_inputs(model, "chroma", *LATENT, batch=batch, seed=seed, text_tokens=TEXT)
    text = inputs["attention_mask"][:, :TEXT]
    assert inputs["attention_mask"].dtype == torch.float32 and text.tolist()[0] == [1.0, 1.0, 1.0, 0.0, 0.0]
    return inputs


@pytest.mark.parametrize("method", list(METHODS))
def test_chroma_float_mask_matches_every_attention_s_queries_and_keys(models, method):
    """The mask each attention gets is the pipeline's outer product over its kept queries and keys: the text part
    exactly as the pipeline made it, and every image entry 1."""
    model = models["chroma"]
    inputs = chroma_inputs(model)
    vanilla = run("chroma", model, inputs)
    with tokenmerge.patched(model, **METHODS[method]):
        calls = attention_calls("chroma", model, inputs)
        out = run("chroma", model, inputs)
    assert len(calls) == 3 and torch.isfinite(out).all() and not torch.equal(out, vanilla)
    text_mask = inputs["attention_mask"][:, :TEXT]
    for q, k, mask in calls:
        queries, keys = q.shape[-2], k.shape[-2]
        if method == "tome":
            assert queries == keys == TEXT + GRID.numel - MERGED
        else:
            assert (queries, keys) == (TEXT + GRID.numel, TEXT + KEPT)
        assert mask is not None and mask.dtype == torch.float32 and mask.shape == (2, 1, queries, keys)
        rows = torch.cat([text_mask, torch.ones(2, queries - TEXT)], 1)
        columns = torch.cat([text_mask, torch.ones(2, keys - TEXT)], 1)
        assert torch.equal(mask[:, 0], rows[:, :, None] * columns[:, None, :])


def test_chroma_without_a_mask(models):
    model = models["chroma"]
    inputs = {**chroma_inputs(model), "attention_mask": None}
    for options in METHODS.values():
        with tokenmerge.patched(model, **options):
            calls = attention_calls("chroma", model, inputs)
        assert calls and all(mask is None for _, _, mask in calls)


def test_chroma_text_keys_are_kept(models):
    """Under ToDo the first attention's keys are vanilla's text keys, then its image keys at the kept positions."""
    model = models["chroma"]
    inputs = chroma_inputs(model)
    (_, k0, _), *_ = attention_calls("chroma", model, inputs)
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        (_, k, _), *_ = attention_calls("chroma", model, inputs)
    keep = nearest_indices(GRID, (2, 2), "nearest-exact", torch.device("cpu"))
    assert torch.equal(k, torch.cat([k0[..., :TEXT, :], k0[..., TEXT:, :].index_select(-2, keep)], -2))


# -- HiDream -----------------------------------------------------------------------------------------------------
LLAMA = 3  # Llama tokens, other than the T5 tokens: the text is T5 + 2 x Llama


def hidream_inputs(model: torch.nn.Module, latent: tuple[int, int] = LATENT, batch: int = 2, seed: int = 0) -> dict:
    inputs = transformer_inputs(model, "hidream", *latent, batch=batch, seed=seed, text_tokens=TEXT)
    llama = inputs["encoder_hidden_states_llama3"]
    inputs["encoder_hidden_states_llama3"] = llama[:, :, :LLAMA].contiguous()  # the pipeline's stack: (layers, B, L, C)
    return inputs


HIDREAM_TEXT = TEXT + 2 * LLAMA


def layout_of(model: torch.nn.Module, inputs: dict):
    (state,) = [s for _, s in tokenmerge.hooks.states_in([model])]
    return state.layout.containers[0].layout((), inputs)


def test_hidream_layout_square_and_padded(models):
    model = models["hidream"]
    assert model.max_seq == 100
    with tokenmerge.patched(model, ratio=0.5):
        padded = layout_of(model, hidream_inputs(model))
        square = layout_of(model, hidream_inputs(model, (16, 16)))
    assert [(s.kind, s.length) for s in padded.segments] == [("image", 63), ("padding", 37), ("text", HIDREAM_TEXT)]
    assert padded.grid.shape == GRID.shape and padded.stream("image").total == 100
    assert [(s.kind, s.length) for s in square.segments] == [("image", 64), ("text", HIDREAM_TEXT)]


def test_hidream_non_square_tome_merges_the_image_and_the_mask_follows(models):
    """Every attn1 gets its tokens, the padding mask and the rotary rows of one sequence; the padding and the text
    are all there (the mask keeps its 37 zeros and the text's ones)."""
    model = models["hidream"]
    inputs = hidream_inputs(model)
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    attentions = [m for m in model.modules() if type(m).__name__ == "HiDreamAttention"]
    vanilla = run("hidream", model, inputs)
    with tokenmerge.patched(model, ratio=0.5):
        # registered after the patch's hooks: they see what the processor gets
        handles = [
            a.register_forward_pre_hook(
                lambda m, args, kwargs: seen.append((args[0].shape[1], args[1], kwargs["image_rotary_emb"])), with_kwargs=True
            )
            for a in attentions
        ]
        try:
            calls = attention_calls("hidream", model, inputs)
        finally:
            for handle in handles:
                handle.remove()
        out = run("hidream", model, inputs)
    image = 100 - MERGED
    assert [tokens for tokens, _, _ in seen] == [image, image + HIDREAM_TEXT, image + HIDREAM_TEXT]  # 1 dual, 2 single
    for i, (tokens, mask, rope) in enumerate(seen):
        assert mask.shape == (2, tokens) and rope.shape[:2] == (2, image + HIDREAM_TEXT)
        assert mask.sum(1).tolist() == [GRID.numel - MERGED + (HIDREAM_TEXT if i else 0)] * 2
        assert (mask[:, GRID.numel - MERGED : image] == 0).all()  # the padding, in place after the merged image
    assert all(q.shape[-2] == k.shape[-2] == image + HIDREAM_TEXT for q, k, _ in calls)
    assert out.shape == vanilla.shape == (2, 4, *LATENT) and torch.isfinite(out).all() and not torch.equal(out, vanilla)


def test_hidream_non_square_todo_keeps_padding_and_text_keys(models):
    model = models["hidream"]
    inputs = hidream_inputs(model)
    vanilla = attention_calls("hidream", model, inputs)
    with tokenmerge.patched(model, method="todo", kv_factor=2):
        calls = attention_calls("hidream", model, inputs)
    assert len(calls) == len(vanilla) == 3
    for q, k, _ in calls:
        assert (q.shape[-2], k.shape[-2]) == (100 + HIDREAM_TEXT, 100 - GRID.numel + KEPT + HIDREAM_TEXT)
    (_, k0, _), (_, k, _) = vanilla[0], calls[0]
    keep = nearest_indices(GRID, (2, 2), "nearest-exact", torch.device("cpu"))
    assert torch.equal(k, torch.cat([k0[..., : GRID.numel, :].index_select(-2, keep), k0[..., GRID.numel :, :]], -2))


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("latent", [LATENT, (16, 16)], ids=["padded", "square"])
def test_hidream_samples_are_independent_of_their_batch(models, method, latent):
    """Plans and rotary rows per sample: the second sample of a batch gives its own batch-1 result (the Llama
    stack's batch axis is its second)."""
    model = models["hidream"]
    first, second = hidream_inputs(model, latent, batch=1, seed=1), hidream_inputs(model, latent, batch=1, seed=2)
    axis = {"encoder_hidden_states_llama3": 1}
    both = {k: torch.cat([v, second[k]], axis.get(k, 0)) for k, v in first.items()}
    with tokenmerge.patched(model, seed=3, **METHODS[method]):
        alone, together = run("hidream", model, second), run("hidream", model, both)
    assert (together[1:] - alone).abs().max().item() < 1e-4


def test_hidream_pre_patchified_calls_run_unchanged(models):
    model = models["hidream"]
    inputs = hidream_inputs(model)
    tokens, masks, sizes, ids = model.patchify(inputs["hidden_states"])
    inputs = {**inputs, "hidden_states": tokens, "hidden_states_masks": masks, "img_sizes": sizes, "img_ids": ids}
    vanilla = run("hidream", model, inputs)
    with tokenmerge.patched(model, ratio=0.5), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(run("hidream", model, inputs), vanilla)
    assert any("pre-patchified" in str(w.message) for w in caught)
