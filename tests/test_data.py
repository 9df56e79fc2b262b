from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from abtune.config import DataConfig
from abtune.data import (
    CIFAR_STATS,
    AugmentedDataset,
    DatasetInfo,
    DigitsDataset,
    ResumableDistributedSampler,
    build_datasets,
    build_loaders,
    steps_per_epoch,
    stratified_split,
)
from abtune.data import load_digits as read_digits
from abtune.errors import ConfigError

DIGITS_COUNT = 1797
CIFAR_PIXELS = 3 * 32 * 32


def stack(dataset: Dataset) -> tuple[torch.Tensor, list[int]]:
    images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(images), list(labels)


# --- digits -------------------------------------------------------------------------------------


def test_digits_split_sizes_classes_and_shapes() -> None:
    train, val, info = build_datasets(DataConfig(augment=False, val_fraction=0.2), seed=0)
    # scikit-learn puts ceil(0.2 * 1797) = 360 samples into the held-out part
    assert (len(train), len(val)) == (1437, 360)
    assert info == DatasetInfo(num_classes=10, image_size=8, in_channels=3, name="digits")
    image, label = train[0]
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32
    assert torch.equal(image[0], image[1]) and torch.equal(image[0], image[2])
    assert isinstance(label, int) and 0 <= label < 10


def test_digits_split_is_deterministic_disjoint_and_complete() -> None:
    cfg = DataConfig(augment=False)
    train, val, _ = build_datasets(cfg, seed=7)
    again_train, again_val, _ = build_datasets(cfg, seed=7)
    other_train, _, _ = build_datasets(cfg, seed=8)
    assert isinstance(train, DigitsDataset) and isinstance(val, DigitsDataset)
    assert train.indices == again_train.indices and val.indices == again_val.indices
    assert train.indices != other_train.indices
    assert not set(train.indices) & set(val.indices)
    assert sorted(train.indices + val.indices) == list(range(DIGITS_COUNT))


def _sklearn_digits() -> Any:
    """scikit-learn's own digits, imported where a test compares with them (seconds of imports: not at collection)."""
    from sklearn.datasets import load_digits

    return load_digits()


def test_digits_are_scikit_learns_and_so_is_their_split() -> None:
    """abtune reads the digits and splits them without importing scikit-learn (1.4 s per rank): the
    images, labels and the rows of every split must stay scikit-learn's, or a seed's trial would change."""
    from sklearn.model_selection import train_test_split

    digits = _sklearn_digits()
    images, labels = read_digits()
    assert np.array_equal(images, digits.images) and np.array_equal(labels, digits.target)
    rows = np.arange(len(labels))
    for seed in (0, 1, 7, 123, 2**32 - 1):
        for fraction in (0.01, 0.1, 0.2, 0.25, 0.5, 0.9):
            train, val = stratified_split(labels, fraction, seed)
            expected_train, expected_val = train_test_split(rows, test_size=fraction, random_state=seed,
                                                            stratify=labels)
            assert np.array_equal(train, expected_train) and np.array_equal(val, expected_val), (seed, fraction)
    with pytest.raises(ConfigError, match="val_fraction=0.001 leaves a split without every class"):
        stratified_split(labels, 0.001, 0)


def test_digits_values_are_normalized_with_train_statistics() -> None:
    train, val, _ = build_datasets(DataConfig(augment=False), seed=0)
    assert isinstance(train, DigitsDataset) and isinstance(val, DigitsDataset)
    digits = _sklearn_digits()
    raw = torch.from_numpy(digits.images).float() / 16.0
    mean, std = raw[train.indices].mean(), raw[train.indices].std()
    train_images, train_labels = stack(train)
    assert train_images.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert train_images.std().item() == pytest.approx(1.0, abs=1e-4)
    # Every sample is its load_digits row, scaled to [0, 1], normalized, repeated to 3 channels.
    val_images, val_labels = stack(val)
    expected = ((raw[val.indices] - mean) / std).unsqueeze(1).expand(-1, 3, -1, -1)
    torch.testing.assert_close(val_images, expected)
    assert val_labels == digits.target[val.indices].tolist()
    assert train_labels == digits.target[train.indices].tolist()


def test_digits_resize() -> None:
    train, val, info = build_datasets(DataConfig(image_size=16), seed=0)
    assert info.image_size == 16
    assert train[0][0].shape == val[0][0].shape == (3, 16, 16)


def test_digits_augmentation_shifts_by_at_most_one_pixel_deterministically() -> None:
    plain, _, _ = build_datasets(DataConfig(augment=False), seed=3)
    train, _, _ = build_datasets(DataConfig(augment=True), seed=3)
    assert isinstance(train, AugmentedDataset)
    rng_before = torch.get_rng_state()
    background = plain[0][0].min()  # the normalized value of a blank (0) pixel
    shifts_seen = set()
    for index in range(40):
        image = train[index][0]
        assert torch.equal(image, train[index][0])  # same (seed, epoch, index): same augmentation
        shifts_seen.add(_find_shift(plain[index][0], image, background))
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is neither used nor changed
    assert len(shifts_seen) > 1

    changed = []
    for index in range(40):
        before = train[index][0]
        train.set_epoch(1)
        changed.append(not torch.equal(before, train[index][0]))
        train.set_epoch(0)
    assert any(changed)


def _find_shift(original: torch.Tensor, shifted: torch.Tensor, background: torch.Tensor) -> tuple[int, int]:
    padded = torch.nn.functional.pad(original, (1, 1, 1, 1), value=background.item())
    size = original.shape[-1]
    for dy in range(3):
        for dx in range(3):
            if torch.allclose(padded[:, dy : dy + size, dx : dx + size], shifted):
                return dy - 1, dx - 1
    raise AssertionError("augmented image is not a shift of the original by at most one pixel")


# --- CIFAR, written in the real python-pickle format --------------------------------------------


class Py2Str(bytes):
    """A Python 2 `str`. The real CIFAR pickles were written by Python 2, so their keys and file
    names are byte strings (opcode BINSTRING): `pickle.load(f, encoding="bytes")` gives b'data',
    `encoding="latin1"` (what torchvision uses) gives 'data'."""


class Py2Pickler(pickle._Pickler):  # the pure-Python pickler, whose dispatch table can be extended
    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj: Py2Str) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + bytes(obj))
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + bytes(obj))
        self.memoize(obj)

    dispatch[Py2Str] = save_py2_str


def write_py2_pickle(path: Path, content: dict[str, Any]) -> None:
    def convert(value: Any) -> Any:
        if isinstance(value, str):
            return Py2Str(value.encode())
        if isinstance(value, list):
            return [convert(item) for item in value]
        return value

    with path.open("wb") as file:
        Py2Pickler(file, protocol=2).dump({convert(key): convert(value) for key, value in content.items()})


def random_images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, CIFAR_PIXELS), dtype=np.uint8)


def write_cifar100(
    root: Path, train_count: int = 6, test_count: int = 4
) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    written = {}
    for split, count in (("train", train_count), ("test", test_count)):
        data = random_images(count, seed=len(split))
        fine = [(7 * i + 3) % 100 for i in range(count)]
        write_py2_pickle(
            folder / split,
            {
                "filenames": [f"{split}_{i}.png" for i in range(count)],
                "batch_label": f"{split}ing batch 1 of 1",
                "fine_labels": fine,
                "coarse_labels": [label // 5 for label in fine],
                "data": data,
            },
        )
        written[split] = (data, fine)
    write_py2_pickle(
        folder / "meta",
        {
            "fine_label_names": [f"fine_{i}" for i in range(100)],
            "coarse_label_names": [f"coarse_{i}" for i in range(20)],
        },
    )
    return written


def write_cifar10(
    root: Path, per_batch: int = 2, test_count: int = 3
) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    chunks = {}
    for number, name in enumerate(files):
        count = test_count if name == "test_batch" else per_batch
        data, labels = random_images(count, seed=number), [(number + i) % 10 for i in range(count)]
        write_py2_pickle(
            folder / name,
            {
                "batch_label": name,
                "labels": labels,
                "data": data,
                "filenames": [f"{name}_{i}.png" for i in range(count)],
            },
        )
        chunks[name] = (data, labels)
    write_py2_pickle(
        folder / "batches.meta",
        {
            "label_names": [f"class_{i}" for i in range(10)],
            "num_cases_per_batch": per_batch,
            "num_vis": CIFAR_PIXELS,
        },
    )
    train_parts = [chunks[name] for name in files[:-1]]
    return {
        "train": (
            np.concatenate([data for data, _ in train_parts]),
            [y for _, labels in train_parts for y in labels],
        ),
        "test": chunks["test_batch"],
    }


def assert_images_come_back(dataset: Dataset, data: np.ndarray, labels: list[int], name: str) -> None:
    mean, std = (torch.tensor(values).view(3, 1, 1) for values in CIFAR_STATS[name])
    images, loaded_labels = stack(dataset)
    pixels = (images * std + mean) * 255  # undo Normalize and ToTensor's division by 255
    expected = torch.from_numpy(data).view(-1, 3, 32, 32).float()  # rows hold the R, G, B planes
    torch.testing.assert_close(pixels, expected, atol=1e-3, rtol=0)
    assert loaded_labels == labels


def test_written_archive_is_the_documented_format(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    with (tmp_path / "cifar-100-python" / "train").open("rb") as file:
        batch = pickle.load(file, encoding="bytes")
    assert {b"data", b"fine_labels", b"coarse_labels", b"filenames"} <= set(batch)
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (6, CIFAR_PIXELS)


@pytest.mark.parametrize(
    "name, writer, classes", [("cifar100", write_cifar100, 100), ("cifar10", write_cifar10, 10)]
)
def test_cifar_pixels_and_labels_come_back(tmp_path: Path, name: str, writer: Any, classes: int) -> None:
    written = writer(tmp_path)
    cfg = DataConfig(name=name, root=tmp_path, verify_checksums=False, augment=False)
    train, val, info = build_datasets(cfg, seed=0)
    assert info == DatasetInfo(num_classes=classes, image_size=32, in_channels=3, name=name)
    assert_images_come_back(train, *written["train"], name)
    assert_images_come_back(val, *written["test"], name)


def test_cifar_augmentation(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    cfg = DataConfig(name="cifar100", root=tmp_path, verify_checksums=False)
    train, val, _ = build_datasets(cfg, seed=0)
    assert isinstance(train, AugmentedDataset)
    image, label = train[1]
    assert image.shape == (3, 32, 32) and label == (7 * 1 + 3) % 100
    assert torch.equal(image, train[1][0])
    assert val[0][0].shape == (3, 32, 32)


def test_cifar_resized(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    cfg = DataConfig(name="cifar10", root=tmp_path, verify_checksums=False, image_size=48)
    train, val, info = build_datasets(cfg, seed=0)
    assert info.image_size == 48
    assert train[0][0].shape == val[0][0].shape == (3, 48, 48)


@pytest.mark.parametrize("name, writer", [("cifar100", write_cifar100), ("cifar10", write_cifar10)])
def test_cifar_checksums_verified_by_default(tmp_path: Path, name: str, writer: Any) -> None:
    writer(tmp_path)
    with pytest.raises(ConfigError, match="data.verify_checksums"):
        build_datasets(DataConfig(name=name, root=tmp_path), seed=0)


def test_cifar_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        build_datasets(DataConfig(name="cifar100", root=tmp_path), seed=0)
    assert str(tmp_path / "cifar-100-python") in str(error.value)
    assert "data.download: true" in str(error.value)


def test_cifar_incomplete_folder(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    (tmp_path / "cifar-100-python" / "test").unlink()
    with pytest.raises(ConfigError, match="incomplete"):
        build_datasets(DataConfig(name="cifar100", root=tmp_path, verify_checksums=False), seed=0)


# --- ImageNet folder tree -----------------------------------------------------------------------

IMAGENET_CLASSES = ["n01", "n02", "n03"]


def write_image_tree(root: Path, per_class: dict[str, int]) -> None:
    rng = np.random.default_rng(0)
    for split, count in per_class.items():
        for name in IMAGENET_CLASSES:
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{name}_{i}.JPEG")


def test_imagenet_folder_tree(tmp_path: Path) -> None:
    write_image_tree(tmp_path, {"train": 2, "val": 1})
    train, val, info = build_datasets(DataConfig(name="imagenet", root=tmp_path, image_size=16), seed=0)
    assert info == DatasetInfo(num_classes=3, image_size=16, in_channels=3, name="imagenet")
    assert (len(train), len(val)) == (6, 3)
    assert isinstance(train, AugmentedDataset)
    assert train.base.classes == val.classes == IMAGENET_CLASSES
    train_images, train_labels = stack(train)
    val_images, val_labels = stack(val)
    assert train_images.shape == (6, 3, 16, 16) and val_images.shape == (3, 3, 16, 16)
    assert train_labels == [0, 0, 1, 1, 2, 2] and val_labels == [0, 1, 2]


def test_imagenet_default_size_without_augmentation(tmp_path: Path) -> None:
    write_image_tree(tmp_path, {"train": 1, "val": 1})
    train, val, info = build_datasets(DataConfig(name="imagenet", root=tmp_path, augment=False), seed=0)
    assert info.image_size == 224
    assert train[0][0].shape == val[0][0].shape == (3, 224, 224)


def test_imagenet_missing_split(tmp_path: Path) -> None:
    write_image_tree(tmp_path, {"train": 1})
    with pytest.raises(ConfigError, match=str(tmp_path / "val")):
        build_datasets(DataConfig(name="imagenet", root=tmp_path), seed=0)


def test_imagenet_class_mismatch(tmp_path: Path) -> None:
    write_image_tree(tmp_path, {"train": 1, "val": 1})
    (tmp_path / "val" / IMAGENET_CLASSES[0] / f"{IMAGENET_CLASSES[0]}_0.JPEG").rename(tmp_path / "moved.JPEG")
    (tmp_path / "val" / IMAGENET_CLASSES[0]).rmdir()
    with pytest.raises(ConfigError, match="differ"):
        build_datasets(DataConfig(name="imagenet", root=tmp_path), seed=0)


# --- sampling and loading -----------------------------------------------------------------------


class Range(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


@pytest.mark.parametrize("size", [20, 21])
def test_sampler_shards_are_disjoint_and_cover_the_epoch(size: int) -> None:
    dataset = Range(size)
    shards = []
    for rank in range(2):
        sampler = ResumableDistributedSampler(dataset, num_replicas=2, rank=rank, seed=5)
        sampler.set_epoch(3)
        reference = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=5, drop_last=True)
        reference.set_epoch(3)
        assert list(sampler) == list(reference)  # DistributedSampler's order, seed + epoch
        shards.append(list(sampler))
    assert len(shards[0]) == len(shards[1]) == size // 2
    assert not set(shards[0]) & set(shards[1])
    permutation = torch.randperm(size, generator=torch.Generator().manual_seed(5 + 3)).tolist()
    assert sorted(shards[0] + shards[1]) == sorted(permutation[: 2 * (size // 2)])


def test_sampler_set_position_yields_the_tail() -> None:
    dataset = Range(50)
    sampler = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=0)
    sampler.set_epoch(4)
    full = list(sampler)
    for start in (0, 1, 13, 25):
        sampler.set_position(4, start)
        assert list(sampler) == full[start:]
        assert len(sampler) == len(full) - start
    sampler.set_epoch(5)
    assert len(list(sampler)) == 25 and list(sampler) != full
    assert dataset.epochs[-1] == 5  # the epoch reaches the data set (augmentation seeds)
    with pytest.raises(ValueError):
        sampler.set_position(5, 26)


def run_epoch(loader: DataLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumed_loader_sees_the_same_batches(num_workers: int) -> None:
    cfg = DataConfig(augment=True)
    batch, consumed = 16, 5

    train, val, _ = build_datasets(cfg, seed=11)
    loader, _, sampler = build_loaders(
        train, val, batch, rank=1, world_size=2, seed=11, num_workers=num_workers
    )
    sampler.set_epoch(2)
    rng_before = torch.get_rng_state()
    full = run_epoch(loader)
    if num_workers == 0:
        assert torch.equal(torch.get_rng_state(), rng_before)  # loading leaves the global RNG alone
    assert len(full) == len(loader) == steps_per_epoch(len(train), batch, 2) == 1437 // 2 // 16

    torch.manual_seed(1234)  # a restarted process: global RNG state differs
    train, val, _ = build_datasets(cfg, seed=11)
    loader, _, sampler = build_loaders(
        train, val, batch, rank=1, world_size=2, seed=11, num_workers=num_workers
    )
    sampler.set_position(2, consumed * batch)
    resumed = run_epoch(loader)
    assert len(resumed) == len(full) - consumed
    for (images, labels), (expected_images, expected_labels) in zip(resumed, full[consumed:], strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


def test_epochs_differ() -> None:
    train, val, _ = build_datasets(DataConfig(), seed=0)
    loader, _, sampler = build_loaders(train, val, 32, rank=0, world_size=1, seed=0, num_workers=0)
    sampler.set_epoch(0)
    first = next(iter(loader))[0]
    sampler.set_epoch(1)
    assert not torch.equal(first, next(iter(loader))[0])


def test_val_shards_cover_the_val_set_once() -> None:
    train, val, _ = build_datasets(DataConfig(augment=False), seed=0)
    seen: list[int] = []
    labels: list[int] = []
    for rank in range(3):
        _, val_loader, _ = build_loaders(train, val, 32, rank=rank, world_size=3, seed=0, num_workers=0)
        seen.extend(val_loader.sampler)
        labels.extend(label for _, batch_labels in val_loader for label in batch_labels.tolist())
    assert sorted(seen) == list(range(len(val)))
    assert sorted(labels) == sorted(val.labels)


def test_steps_per_epoch() -> None:
    assert steps_per_epoch(1437, 32, 2) == 22  # 1437 // 2 = 718 samples per rank, 22 full batches of 32
    assert steps_per_epoch(64, 32, 2) == 1
    with pytest.raises(ConfigError, match="train.local_batch_size"):
        steps_per_epoch(63, 32, 2)
