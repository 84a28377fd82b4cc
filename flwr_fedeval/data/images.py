"""Image-folder loader: one subfolder per class, PNG/JPEG, grayscale, resized.

Used for the chest X-ray data (``../shared/data/chest-xray``), whose images are
8-bit grayscale with the longer side at most 256 px; every image is resized to
the model's input (default 128×128, as in Walskaar et al. 2023, §4).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "ImageLoadError", "load_image_folder"]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class ImageLoadError(ValueError):
    """An image file could not be read or decoded; the message names the file."""


def _list_images(class_dir: Path) -> list[Path]:
    return sorted(
        p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )


def load_image_folder(
    root: str | Path,
    classes: Sequence[str] | None = None,
    *,
    image_size: tuple[int, int] = (128, 128),
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Load a folder of class subfolders as grayscale arrays.

    Parameters
    ----------
    root : str or Path
        Folder holding one subfolder per class (e.g. ``chest-xray/``).
    classes : sequence of str, optional
        Subfolders to load, in label order: ``classes[k]`` gets label ``k``
        (for a binary task put the negative class first, e.g.
        ``["normal", "pneumonia"]``). Default: every subfolder, sorted.
    image_size : (height, width), default=(128, 128)
        Output size; images are resized with bilinear filtering.

    Returns
    -------
    x : ndarray of shape (n_images, height, width, 1), dtype float32
        Pixel intensities scaled to ``[0, 1]``.
    y : ndarray of shape (n_images,), dtype int64
        Class index of each image.
    class_names : list of str
        The class folder names, index = label.

    Raises
    ------
    FileNotFoundError
        If ``root`` or a requested class folder does not exist.
    ValueError
        If there are no class folders, or a class folder holds no PNG/JPEG file.
    ImageLoadError
        If a file cannot be decoded (the message gives its full path).
    """
    from flwr_fedeval._extras import require

    PIL_Image = require("PIL.Image", purpose="the image-folder loader")  # local: only this loader needs PIL
    Image, UnidentifiedImageError = PIL_Image, PIL_Image.UnidentifiedImageError

    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root.resolve()}")
    if classes is None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        if not classes:
            raise ValueError(f"no class subfolders in {root.resolve()}")
    classes = list(classes)
    height, width = int(image_size[0]), int(image_size[1])
    if height <= 0 or width <= 0:
        raise ValueError(f"image_size must be positive, got {image_size}")

    files: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        class_dir = root / name
        if not class_dir.is_dir():
            raise FileNotFoundError(f"class folder not found: {class_dir.resolve()}")
        found = _list_images(class_dir)
        if not found:
            raise ValueError(
                f"class folder {class_dir.resolve()} holds no image ({', '.join(IMAGE_SUFFIXES)})"
            )
        files.extend((path, label) for path in found)

    x = np.empty((len(files), height, width, 1), dtype=np.float32)
    y = np.empty(len(files), dtype=np.int64)
    for i, (path, label) in enumerate(files):
        try:
            with Image.open(path) as img:
                img = img.convert("L").resize((width, height), Image.Resampling.BILINEAR)
                x[i, :, :, 0] = np.asarray(img, dtype=np.float32) / 255.0
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise ImageLoadError(f"cannot read image {path.resolve()}: {exc}") from exc
        y[i] = label
    log.info("Loaded %d images of %d classes from %s", len(files), len(classes), root)
    return x, y, classes
