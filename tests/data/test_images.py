import numpy as np
import pytest
from PIL import Image
from shared_paths import CHEST_XRAY

from flwr_fedeval.data.images import ImageLoadError, load_image_folder


def _write_png(path, value, size=(40, 30)):
    Image.fromarray(np.full(size[::-1], value, dtype=np.uint8)).save(path)


@pytest.fixture
def folder(tmp_path):
    for name, value in (("neg", 0), ("pos", 255)):
        (tmp_path / name).mkdir()
        for k in range(3):
            _write_png(tmp_path / name / f"img{k}.png", value)
    return tmp_path


def test_loads_grayscale_resized_with_labels_in_class_order(folder):
    x, y, names = load_image_folder(folder, ["pos", "neg"], image_size=(16, 24))
    assert x.shape == (6, 16, 24, 1) and x.dtype == np.float32
    assert names == ["pos", "neg"]
    assert y.tolist() == [0, 0, 0, 1, 1, 1]
    assert np.allclose(x[y == 0], 1.0) and np.allclose(x[y == 1], 0.0)


def test_rgb_and_jpeg_are_converted_to_one_channel(folder):
    Image.new("RGB", (20, 20), (255, 0, 0)).save(folder / "pos" / "colour.jpg")
    x, y, _ = load_image_folder(folder, image_size=(8, 8))
    assert x.shape == (7, 8, 8, 1)
    assert x.min() >= 0.0 and x.max() <= 1.0


def test_missing_root_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_image_folder(tmp_path / "nope")


def test_missing_class_folder_raises_naming_it(folder):
    with pytest.raises(FileNotFoundError, match="covid"):
        load_image_folder(folder, ["neg", "covid"])


def test_empty_class_folder_raises(folder):
    (folder / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no image"):
        load_image_folder(folder, ["neg", "empty"])


def test_corrupt_file_raises_with_full_path(folder):
    bad = folder / "pos" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(ImageLoadError) as info:
        load_image_folder(folder)
    assert str(bad.resolve()) in str(info.value)


@pytest.mark.skipif(not CHEST_XRAY.is_dir(), reason="../shared/data/chest-xray not present")
def test_real_chest_xray_covid_vs_normal_loads():
    x, y, names = load_image_folder(CHEST_XRAY, ["normal", "covid"], image_size=(32, 32))
    assert names == ["normal", "covid"]
    assert (y == 1).sum() == 124 and (y == 0).sum() == 500
    assert x.shape == (624, 32, 32, 1)
    assert 0.0 <= x.min() < x.max() <= 1.0
