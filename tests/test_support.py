"""The family registry as users see it: the support matrix (command and README), refusals with their reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tokenmerge
from tokenmerge.families import families, family_of, get
from tokenmerge.tools.cli import main
from tokenmerge.tools.support import BEGIN, END, docs_block, matrix, readme_block

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("page,block", [(README, readme_block), (README.parent / "docs" / "support.md", docs_block)])
def test_readme_matrix_is_the_registry_matrix(page, block):
    """The README's summary (families alike in one row) and docs/support.md's whole matrix are the registry's."""
    text = page.read_text()
    assert BEGIN in text and END in text, f"{page.name} must hold the generated support matrix"
    found = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert found == block(), f"{page.name}'s support matrix is stale: run `tokenmerge support --write-readme README.md`"


def test_support_command_prints_every_family(capsys):
    assert main(["support", "--notes"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == matrix(notes=True)
    for family in families():
        assert family.title in out


def test_every_class_is_claimed_by_one_family_and_names_are_unique():
    names = [f.name for f in families()]
    assert len(names) == len(set(names))
    classes = [c for f in families() for c in f.classes]
    assert len(classes) == len(set(classes))


def test_a_family_is_found_along_the_mro_nearest_class_first():
    from diffusers import FluxTransformer2DModel

    class MyFlux(FluxTransformer2DModel):
        pass

    assert family_of(MyFlux.__new__(MyFlux)) is get("flux")


def test_sana_is_refused_with_its_reason():
    from diffusers import SanaTransformer2DModel

    model = SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=4,
        num_layers=1,
        num_cross_attention_heads=2,
        cross_attention_head_dim=4,
        cross_attention_dim=8,
        caption_channels=8,
        sample_size=8,
    )
    with pytest.raises(TypeError, match="SanaTransformer2DModel .SANA.: its self-attention is linear"):
        tokenmerge.apply_patch(model, method="auto")
    assert tokenmerge.get_config(model) is None


def test_a_method_its_family_does_not_offer_is_refused_with_why():
    """NucleusMoE-Image is patched for tome, todo and auto; the token cache is refused at the patch (and by
    update_options), naming the method, the reason and the methods offered, the model left as it was."""
    from tokenmerge.tools.architectures import build_model

    model = build_model("nucleusmoe-image", small=True)
    with pytest.raises(ValueError, match=r"method='tokencache' is not offered on NucleusMoE-Image: its experts .* one of tome, todo, auto"):
        tokenmerge.apply_patch(model, method="tokencache")
    assert tokenmerge.get_config(model) is None
    with tokenmerge.patched(model, method="todo"):
        with pytest.raises(ValueError, match="not offered"):
            tokenmerge.update_options(model, method="tokencache")
        assert tokenmerge.get_config(model).method == "todo"
    assert "| NucleusMoE-Image | `NucleusMoEImageTransformer2DModel` | yes | yes | yes | no |" in matrix()


def test_an_unsupported_model_lists_the_supported_families():
    with pytest.raises(TypeError, match=r"Supported families: .*Flux\.2"):
        tokenmerge.apply_patch(torch.nn.Linear(2, 2))
