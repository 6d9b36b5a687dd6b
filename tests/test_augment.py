"""`random_shift` must equal ReplicationPad2d(pad) followed by a random crop, drawn per image (DrQ)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from protorl.agents.augment import random_shift


def _candidates(images: torch.Tensor, pad: int) -> dict[tuple[int, int], torch.Tensor]:
    """All (2 pad + 1)^2 crops of the replicate-padded (B, C, H, W) images, keyed by their (dy, dx) shift."""
    height, width = images.shape[-2:]
    padded = nn.ReplicationPad2d(pad)(images.double())
    return {
        (dy, dx): padded[..., pad + dy: pad + dy + height, pad + dx: pad + dx + width]
        for dy, dx in itertools.product(range(-pad, pad + 1), repeat=2)
    }


def _recover_shifts(images: torch.Tensor, shifted: torch.Tensor, pad: int) -> list[tuple[int, int]]:
    """The shift of each output image; fails unless every output equals one padded crop exactly."""
    candidates = _candidates(images, pad)
    keys = list(candidates)
    out = shifted.double()
    matches = torch.stack([(out == crop).flatten(1).all(dim=1) for crop in candidates.values()], dim=1)
    assert matches.any(dim=1).all(), "an output is not a crop of its replicate-padded image"
    assert (matches.sum(dim=1) == 1).all()  # random content: every candidate crop differs
    return [keys[i] for i in matches.float().argmax(dim=1).tolist()]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("pad", [1, 4])
def test_random_shift_is_pad_then_crop(dtype, pad):
    gen = torch.Generator().manual_seed(pad)
    if dtype == torch.uint8:
        images = torch.randint(0, 256, (12, 3, 14, 16), generator=gen, dtype=torch.uint8)
    else:
        images = torch.rand(12, 3, 14, 16, generator=gen)
    out = random_shift(images, pad=pad, generator=torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    assert out.dtype == dtype
    shifts = _recover_shifts(images, out, pad)
    assert len(set(shifts)) > 3  # drawn per image, not once per batch
    assert any(s != (0, 0) for s in shifts)


def test_random_shift_covers_every_shift_roughly_uniformly():
    pad, batch = 2, 2500
    gen = torch.Generator().manual_seed(5)
    images = torch.randint(0, 256, (batch, 1, 6, 6), generator=gen, dtype=torch.uint8)
    out = random_shift(images, pad=pad, generator=torch.Generator().manual_seed(6))
    counts: dict[tuple[int, int], int] = {}
    for shift in _recover_shifts(images, out, pad):
        counts[shift] = counts.get(shift, 0) + 1
    assert len(counts) == (2 * pad + 1) ** 2
    expected = batch / 25
    assert all(0.6 * expected < c < 1.4 * expected for c in counts.values()), counts


def test_random_shift_is_reproducible_with_a_seeded_generator():
    images = torch.rand(8, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    a = random_shift(images, pad=3, generator=torch.Generator().manual_seed(2))
    b = random_shift(images, pad=3, generator=torch.Generator().manual_seed(2))
    c = random_shift(images, pad=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_random_shift_pad_zero_is_identity(dtype):
    images = (torch.rand(4, 3, 9, 9, generator=torch.Generator().manual_seed(4)) * 255).to(dtype)
    assert torch.equal(random_shift(images, pad=0), images)


def test_random_shift_does_not_modify_its_input():
    images = torch.randint(0, 256, (4, 3, 9, 9), generator=torch.Generator().manual_seed(7),
                           dtype=torch.uint8)
    before = images.clone()
    random_shift(images, pad=4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(images, before)


def test_random_shift_of_a_constant_image_is_constant():
    # replicate padding never brings in zeros (unlike zero padding)
    images = torch.full((5, 3, 8, 8), 200, dtype=torch.uint8)
    assert torch.equal(random_shift(images, pad=4, generator=torch.Generator().manual_seed(9)), images)


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_random_shift_reads_any_memory_layout_as_its_values(layout):
    # replay batches are contiguous, but a caller may pass channels-last images or a view with gaps
    gen = torch.Generator().manual_seed(10)
    images = torch.randint(0, 256, (6, 3, 12, 26), generator=gen, dtype=torch.uint8)
    view = (images.contiguous(memory_format=torch.channels_last) if layout == "channels_last"
            else images[:, :, :, ::2])
    out = random_shift(view, pad=3, generator=torch.Generator().manual_seed(11))
    expected = random_shift(view.contiguous(), pad=3, generator=torch.Generator().manual_seed(11))
    assert torch.equal(out, expected)
    _recover_shifts(view, out, pad=3)
