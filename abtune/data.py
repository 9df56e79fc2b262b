"""Data sets and data loaders.

Determinism contract (what makes a resumed run see the same batches as an uninterrupted one):

* Sample order comes from `ResumableDistributedSampler`: a permutation seeded with `seed + epoch`
  (DistributedSampler's semantics); `set_position(epoch, start_index)` skips the consumed part.
* Augmentation randomness is a pure function of (run seed, epoch, sample index): `AugmentedDataset`
  seeds torch's CPU generator from those three numbers for each sample and restores the previous
  generator state afterwards. So augmentation neither reads nor changes the global RNG, does not
  depend on the number of workers, and there is no augmentation RNG state to checkpoint. The
  sampler passes its epoch on to the data set (`set_epoch`/`set_position`); call it before
  creating the epoch's iterator (workers copy the data set when the iterator starts).
* Each DataLoader owns a generator derived from (seed, rank), so creating an iterator never draws
  from the global torch RNG (without it, every `iter(loader)` would advance the global RNG and
  shift e.g. dropout masks after a resume).
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision import datasets, transforms
from torchvision.datasets.utils import check_integrity
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from abtune.config import DataConfig
from abtune.errors import ConfigError
from abtune.words import plural

Transform = Callable[[Any], Any]

RGB_CHANNELS = 3
UINT64_MASK = 2**64 - 1
UINT32_MODULUS = 2**32  # scikit-learn's random_state range

DIGITS_SIZE = 8
DIGITS_CLASSES = 10
DIGITS_MAX_VALUE = 16.0  # load_digits pixels are counts 0..16
DIGITS_MAX_SHIFT = 1  # augmentation: random shift, in pixels of the original 8x8 image

CIFAR_SIZE = 32
CIFAR_CROP_PADDING = 4  # at 32 pixels; scaled with data.image_size
# Per-channel mean and standard deviation of the training images.
CIFAR_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

IMAGENET_SIZE = 224
IMAGENET_RESIZE_RATIO = 256 / 224  # resize the shorter side, then center-crop (the standard eval)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Streams of derived seeds, so that no two uses of the run seed share random numbers.
TRAIN_LOADER_STREAM = 1
VAL_LOADER_STREAM = 2


@dataclass(frozen=True)
class DatasetInfo:
    num_classes: int
    image_size: int
    in_channels: int
    name: str = "custom"  # only for error messages


def derive_seed(*parts: int) -> int:
    """A well-mixed 64-bit seed from integers (any sign), e.g. (seed, epoch, index)."""
    entropy = [part & UINT64_MASK for part in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


@runtime_checkable
class EpochAware(Protocol):
    def set_epoch(self, epoch: int) -> None: ...


class AugmentedDataset(Dataset):
    """`base[index]` with a random `transform` whose randomness depends only on (seed, epoch, index)."""

    def __init__(self, base: Dataset, transform: Transform, seed: int) -> None:
        self.base = base
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample, label = self.base[index]
        # torchvision's random transforms draw from the global CPU generator: seed it for this sample
        # and put the caller's state back. Only the CPU generator is touched (not CUDA's).
        saved = torch.get_rng_state()
        try:
            torch.default_generator.manual_seed(derive_seed(self.seed, self.epoch, index))
            return self.transform(sample), label
        finally:
            torch.set_rng_state(saved)


# --- digits -------------------------------------------------------------------------------------


class DigitsDataset(Dataset):
    """scikit-learn's digits as 1-channel tensors in [0, 1]; `transform` maps one to the model input.

    `indices` are the rows of `load_digits()` this split holds."""

    def __init__(
        self, images: torch.Tensor, labels: list[int], indices: list[int], transform: Transform | None
    ) -> None:
        self.images = images
        self.labels = labels
        self.indices = indices
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index]
        return (image if self.transform is None else self.transform(image)), self.labels[index]


def _digits(cfg: DataConfig, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    pixels, targets = load_digits()
    size = cfg.image_size or DIGITS_SIZE
    images = torch.from_numpy(pixels).float().unsqueeze(1) / DIGITS_MAX_VALUE
    if size != DIGITS_SIZE:
        images = TF.resize(images, [size, size], interpolation=InterpolationMode.BILINEAR, antialias=True)
    train_rows, val_rows = stratified_split(targets, cfg.val_fraction, seed % UINT32_MODULUS)
    mean, std = images[train_rows].mean().item(), images[train_rows].std().item()
    finish = transforms.Compose([transforms.Normalize([mean], [std]), _RepeatChannels(RGB_CHANNELS)])

    def split(rows: np.ndarray, transform: Transform | None) -> DigitsDataset:
        labels = [int(label) for label in targets[rows]]
        return DigitsDataset(images[rows], labels, rows.tolist(), transform)

    val = split(val_rows, finish)
    if not cfg.augment:
        return split(train_rows, finish), val, _info(cfg, DIGITS_CLASSES, size)
    padding = max(1, DIGITS_MAX_SHIFT * size // DIGITS_SIZE)
    shift = transforms.RandomCrop(size, padding=padding)  # zero padding = background (before normalizing)
    train = AugmentedDataset(split(train_rows, None), transforms.Compose([shift, finish]), seed)
    return train, val, _info(cfg, DIGITS_CLASSES, size)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, (images N x 8 x 8 float64, labels N int), as `sklearn.datasets.load_digits`
    returns them, read from the file scikit-learn ships without importing it: its import (SciPy
    included) is 1.4 s of CPU, a quarter of a rank's start-up."""
    spec = importlib.util.find_spec("sklearn")  # locates the package; runs none of it
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the digits data set ships with scikit-learn, which is not installed: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz")
    with gzip.open(path, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1].reshape(-1, DIGITS_SIZE, DIGITS_SIZE), data[:, -1].astype(int)


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows), each class in proportion: the rows and their order are exactly
    scikit-learn's `train_test_split(rows, test_size=val_fraction, random_state=seed, stratify=labels)`
    (its StratifiedShuffleSplit, 1.3 to 1.9), so a seed keeps the split it had when abtune called it."""
    rng = np.random.RandomState(seed)
    n_val = math.ceil(val_fraction * len(labels))
    classes, class_of_row, class_counts = np.unique(labels, return_inverse=True, return_counts=True)
    if class_counts.min() < 2 or min(len(labels) - n_val, n_val) < len(classes):
        raise ConfigError(f"data.val_fraction={val_fraction} leaves a split without every class: use a value "
                          "nearer 0.5")
    rows_of_class = np.split(np.argsort(class_of_row, kind="stable"), np.cumsum(class_counts)[:-1])
    n_train_of_class = _apportion(class_counts, len(labels) - n_val, rng)
    n_val_of_class = _apportion(class_counts - n_train_of_class, n_val, rng)
    train: list[int] = []
    val: list[int] = []
    for rows, n_train, n_val_here in zip(rows_of_class, n_train_of_class, n_val_of_class, strict=True):
        shuffled = rows.take(rng.permutation(len(rows)), mode="clip")
        train.extend(shuffled[:n_train])
        val.extend(shuffled[n_train:n_train + n_val_here])
    return rng.permutation(train), rng.permutation(val)


def _apportion(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Draws per class in proportion to `counts`, summing to `draws`: the floors, then one more to the
    largest remainders, ties broken at random (scikit-learn's `_approximate_mode`)."""
    share = counts / counts.sum() * draws
    given = np.floor(share)
    missing = int(draws - given.sum())
    remainder = share - given
    for value in np.sort(np.unique(remainder))[::-1]:
        if missing <= 0:
            break
        (tied,) = np.where(remainder == value)
        chosen = rng.choice(tied, size=min(len(tied), missing), replace=False)
        given[chosen] += 1
        missing -= len(chosen)
    return given.astype(int)


class _RepeatChannels:
    def __init__(self, channels: int) -> None:
        self.channels = channels

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.repeat(self.channels, 1, 1)


def _info(cfg: DataConfig, num_classes: int, image_size: int) -> DatasetInfo:
    return DatasetInfo(num_classes, image_size, RGB_CHANNELS, cfg.name)


# --- CIFAR --------------------------------------------------------------------------------------


class _Checksums:
    """Mixin for torchvision's CIFAR classes: with `verify_checksums=False` a file counts as intact
    when it exists; parsing stays torchvision's own code."""

    base_folder: str
    root: str
    train_list: list[list[str]]
    test_list: list[list[str]]
    meta: dict[str, str | None]

    def __init__(self, *args: Any, verify_checksums: bool, **kwargs: Any) -> None:
        self.verify_checksums = verify_checksums
        super().__init__(*args, **kwargs)

    def _check_integrity(self) -> bool:
        if self.verify_checksums:
            return super()._check_integrity()  # type: ignore[misc]
        files = [name for name, _ in self.train_list + self.test_list]
        return all(check_integrity(Path(self.root, self.base_folder, name)) for name in files)

    def _load_meta(self) -> None:
        if not self.verify_checksums:
            self.meta = {**self.meta, "md5": None}  # torchvision's check_integrity skips md5 for None
        super()._load_meta()  # type: ignore[misc]


class CIFAR10(_Checksums, datasets.CIFAR10):
    pass


class CIFAR100(_Checksums, datasets.CIFAR100):
    pass


CIFAR_CLASSES: dict[str, type[CIFAR10 | CIFAR100]] = {"cifar10": CIFAR10, "cifar100": CIFAR100}


def _cifar(cfg: DataConfig, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    root = _root(cfg)
    folder = root / CIFAR_CLASSES[cfg.name].base_folder
    if not cfg.download and not folder.is_dir():
        raise ConfigError(
            f"data.root: {cfg.name} not found: {folder} does not exist; set data.download: true on a "
            f"machine with internet (or copy the extracted '{folder.name}' folder there)"
        )
    size = cfg.image_size or CIFAR_SIZE
    mean, std = CIFAR_STATS[cfg.name]
    resize = [] if size == CIFAR_SIZE else [transforms.Resize(size)]
    normalize = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    val = _open_cifar(cfg, root, train=False, transform=transforms.Compose([*resize, *normalize]))
    info = _info(cfg, len(val.classes), size)
    if not cfg.augment:
        return _open_cifar(cfg, root, train=True, transform=val.transform), val, info
    padding = CIFAR_CROP_PADDING * size // CIFAR_SIZE
    flip_and_shift = [transforms.RandomCrop(size, padding=padding), transforms.RandomHorizontalFlip()]
    augment = transforms.Compose([*resize, *flip_and_shift, *normalize])
    train = AugmentedDataset(_open_cifar(cfg, root, train=True, transform=None), augment, seed)
    return train, val, info


def _open_cifar(cfg: DataConfig, root: Path, train: bool, transform: Transform | None) -> CIFAR10 | CIFAR100:
    cls = CIFAR_CLASSES[cfg.name]
    folder = root / cls.base_folder
    try:
        return cls(
            root,
            train=train,
            transform=transform,
            download=cfg.download,
            verify_checksums=cfg.verify_checksums,
        )
    except RuntimeError as error:  # torchvision: "Dataset not found or corrupted ..."
        if cfg.verify_checksums:
            raise ConfigError(
                f"data.verify_checksums: the {cfg.name} files in {folder} are missing or fail torchvision's "
                f"MD5 check ({error}); re-download them (data.download: true), or set "
                f"data.verify_checksums: false for a deliberately different copy"
            ) from None
        raise ConfigError(
            f"data.root: {folder} is incomplete ({error}); copy the complete data set there"
        ) from None
    except OSError as error:  # download failed (URLError is an OSError)
        raise ConfigError(
            f"data.download: could not download {cfg.name} into {root} ({error}); copy the data there instead"
        ) from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
        raise ConfigError(
            f"data.root: the files in {folder} are not in CIFAR's python format ({error!r})"
        ) from None


# --- ImageNet -----------------------------------------------------------------------------------


def _imagenet(cfg: DataConfig, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    root = _root(cfg)
    size = cfg.image_size or IMAGENET_SIZE
    normalize = [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    evaluate = transforms.Compose(
        [transforms.Resize(int(size * IMAGENET_RESIZE_RATIO)), transforms.CenterCrop(size), *normalize]
    )
    val = _open_folder(root / "val", evaluate)
    if not cfg.augment:
        train: Dataset = _open_folder(root / "train", evaluate)
    else:
        augment = transforms.Compose(
            [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), *normalize]
        )
        train = AugmentedDataset(_open_folder(root / "train", None), augment, seed)
    train_classes = _base(train).classes  # type: ignore[attr-defined]
    if train_classes != val.classes:
        raise ConfigError(
            f"data.root: the class folders of {root / 'train'} and {root / 'val'} differ; both need the same classes"
        )
    return train, val, _info(cfg, len(val.classes), size)


def _open_folder(path: Path, transform: Transform | None) -> datasets.ImageFolder:
    if not path.is_dir():
        raise ConfigError(
            f"data.root: ImageNet folder {path} does not exist; expected root/train/<class>/*.JPEG "
            "and root/val/<class>/*.JPEG"
        )
    try:
        return datasets.ImageFolder(path, transform=transform)
    except FileNotFoundError as error:  # no class folders, or no images in them
        raise ConfigError(f"data.root: {path}: {error}") from None


def _base(dataset: Dataset) -> Dataset:
    return dataset.base if isinstance(dataset, AugmentedDataset) else dataset


def _root(cfg: DataConfig) -> Path:
    if cfg.root is None:  # DataConfig's validator already requires it; kept for a clear message
        raise ConfigError(f"data.root: data set '{cfg.name}' needs the folder that holds it")
    return cfg.root.expanduser()


DATASET_BUILDERS: dict[str, Callable[[DataConfig, int], tuple[Dataset, Dataset, DatasetInfo]]] = {
    "digits": _digits,
    "cifar10": _cifar,
    "cifar100": _cifar,
    "imagenet": _imagenet,
}


def build_datasets(cfg: DataConfig, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    """(train, val, info). The training set applies augmentation when `cfg.augment`; CIFAR and
    ImageNet validate on their official test/validation split, digits on a `val_fraction` split."""
    return DATASET_BUILDERS[cfg.name](cfg, seed)


# --- sampling and loading -----------------------------------------------------------------------


class ResumableDistributedSampler(DistributedSampler[int]):
    """DistributedSampler (shuffle with `seed + epoch`, shard `rank::num_replicas` of the shuffled
    order, tail dropped so every rank has the same count) that can start inside an epoch.

    `set_position(epoch, k)` makes the next iteration yield the shard of `epoch` from its k-th
    sample on, i.e. k = batches consumed * local batch size. `set_epoch` starts at sample 0. The
    epoch is passed on to the data set when it is `EpochAware` (augmentation seeds)."""

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.start_index = 0

    def set_epoch(self, epoch: int) -> None:
        self.set_position(epoch, 0)

    def set_position(self, epoch: int, start_index: int) -> None:
        if not 0 <= start_index <= self.num_samples:
            raise ValueError(
                f"start_index {start_index} is outside this rank's epoch of {self.num_samples} samples"
            )
        super().set_epoch(epoch)
        self.start_index = start_index
        if isinstance(self.dataset, EpochAware):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return islice(super().__iter__(), self.start_index, None)

    def __len__(self) -> int:
        return self.num_samples - self.start_index


def steps_per_epoch(train_size: int, local_batch_size: int, world_size: int) -> int:
    """Full local batches each rank gets per epoch (both the shard tail and the last partial batch are dropped)."""
    steps = train_size // world_size // local_batch_size
    if steps == 0:
        raise ConfigError(
            f"train.local_batch_size: {plural(local_batch_size, 'sample')} x {plural(world_size, 'rank')} is more than the "
            f"{train_size} training samples; lower train.local_batch_size"
        )
    return steps


def build_loaders(
    train: Dataset,
    val: Dataset,
    local_batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int,
) -> tuple[DataLoader, DataLoader, ResumableDistributedSampler]:
    """(train loader, val loader, train sampler). Val shard of this rank: indices rank::world_size,
    no padding, so summing correct counts over ranks gives the exact accuracy (a shard may be empty)."""
    steps_per_epoch(len(train), local_batch_size, world_size)  # type: ignore[arg-type]
    sampler = ResumableDistributedSampler(train, num_replicas=world_size, rank=rank, seed=seed)
    train_loader = DataLoader(
        train,
        batch_size=local_batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        generator=_generator(seed, rank, TRAIN_LOADER_STREAM),
        persistent_workers=False,  # workers must copy the data set anew each epoch to see its epoch
    )
    val_loader = DataLoader(
        val,
        batch_size=local_batch_size,
        sampler=range(rank, len(val), world_size),  # type: ignore[arg-type]
        num_workers=num_workers,
        generator=_generator(seed, rank, VAL_LOADER_STREAM),
    )
    return train_loader, val_loader, sampler


def _generator(seed: int, rank: int, stream: int) -> torch.Generator:
    # Seeds the workers (base seed) and keeps iter(loader) away from the global RNG.
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, rank, stream))
    return generator
