"""Group transforms of the dataset task: what makes the groups of clients different tasks.

Client ``c`` belongs to group ``g = c mod G`` (``G = num-groups``).

``rotate``
    Group ``g`` sees every image rotated by ``360° · g / G`` counter-clockwise
    (``G = 4``: 0°, 90°, 180°, 270°, IFCA's rotated MNIST), labels kept.  The
    rotation is torchvision's ``transforms.functional.rotate`` (nearest
    neighbour, the image size kept); without torchvision (the CPU-only install)
    quarter turns of square images fall back to ``torch.rot90``, which gives
    the same pixels, and any other angle asks for ``pip install "fedroute[vision]"``.
``permute-labels``
    Group ``g > 0`` relabels class ``y`` as ``π_g(y)``, a permutation of the
    classes drawn from ``generator(seed, g, 0, Purpose.TASK)``; group 0 keeps the
    labels.  Works for images and tabular rows alike.
``none``
    No transform: the clients differ only by their partitions (e.g. the writers
    of a ``natural-id`` split); every client is in one latent group, 0 (so the
    run's assignment accuracy says nothing: there is no known grouping).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.validation import invalid

__all__ = ["GROUP_TRANSFORMS", "apply_group_transform", "rotation_angle", "label_permutation", "group_of"]

GROUP_TRANSFORMS = ("rotate", "permute-labels", "none")
"""Values of run-config ``group-transform``."""


def group_of(client: int, num_groups: int, transform: str) -> int:
    """Latent group of client ``client``: ``client mod G``, or ``0`` for everyone under ``none``."""
    return 0 if transform == "none" else int(client) % int(num_groups)


def rotation_angle(group: int, num_groups: int) -> float:
    """Degrees group ``group`` rotates by: ``360 · g / G``."""
    return 360.0 * group / num_groups


def label_permutation(group: int, num_classes: int, seed: int) -> NDArray[np.int64]:
    """``π_g`` as an array (``π_g[y]`` is the new label of ``y``); the identity for group 0."""
    if group == 0:
        return np.arange(num_classes, dtype=np.int64)
    return generator(seed, group, 0, Purpose.TASK).permutation(num_classes).astype(np.int64)


def _rotated(images: NDArray[np.float32], angle: float) -> NDArray[np.float32]:
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(images))
    try:
        from torchvision.transforms.functional import rotate
    except ImportError:
        quarter = angle / 90.0
        if quarter.is_integer() and images.shape[-1] == images.shape[-2]:
            return torch.rot90(tensor, int(quarter) % 4, dims=(-2, -1)).contiguous().numpy()
        raise ImportError(f"group-transform 'rotate' by {angle:g}° needs torchvision: pip install \"fedroute[vision]\" "
                          "(README: torch==2.14.1 torchvision==0.29.1); quarter turns of square images work without "
                          "it") from None
    return rotate(tensor, angle).contiguous().numpy()


def apply_group_transform(features: NDArray[np.float32], labels: NDArray[np.int64], transform: str, group: int,
                          num_groups: int, num_classes: int, seed: int
                          ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Group ``group``'s view of ``(features, labels)`` under ``transform``.

    Raises
    ------
    ValueError
        ``rotate`` on tabular rows (features not ``(n, C, H, W)``), or an unknown transform.
    """
    if transform == "none" or group <= 0:
        return features, labels
    if transform == "permute-labels":
        return features, label_permutation(group, num_classes, seed)[labels]
    if transform == "rotate":
        if features.ndim != 4:
            raise ValueError("run-config 'group-transform' = 'rotate' needs an image dataset (rows of shape "
                             f"(C, H, W)), got rows of shape {features.shape[1:]}; use 'permute-labels' or 'none'")
        return _rotated(features, rotation_angle(group, num_groups)), labels
    raise invalid("run-config 'group-transform'", transform, str(GROUP_TRANSFORMS))
