"""Random-shift augmentation (DrQ, Kostrikov et al. 2020): replicate-pad by `pad`, crop back at random.

Works on the integer pixels and copies whole image rows: each output row is a window of one padded input row,
so the crop is a single gather of rows (no per-pixel index, no padded float copy).
"""

from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
    """(B, C, H, W) images, any dtype -> the same shape, contiguous, each shifted by up to `pad` pixels per axis.

    Equal to `ReplicationPad2d(pad)` followed by a random (H, W) crop, drawn per image.
    """
    if pad == 0:
        return images
    batch, channels, height, width = images.shape
    device = images.device
    shifts = torch.randint(0, 2 * pad + 1, (batch, 2), device=device, generator=generator) - pad  # (B, 2): dy, dx
    # replicate-pad the columns only; rows are replicated by clamping which input row each output row reads
    padded = torch.cat([images[..., :1].expand(-1, -1, -1, pad), images,
                        images[..., -1:].expand(-1, -1, -1, pad)], dim=3).contiguous()  # (B, C, H, W + 2 pad)
    padded_width = width + 2 * pad
    flat = padded.view(-1)
    windows = flat.as_strided((flat.numel() - width + 1, width), (1, 1))  # every run of `width` elements
    rows = (torch.arange(height, device=device)[None, :] + shifts[:, :1]).clamp_(0, height - 1)  # (B, H)
    planes = torch.arange(batch * channels, device=device).view(batch, channels, 1) * height  # (B, C, 1)
    starts = (planes + rows[:, None, :]) * padded_width + pad + shifts[:, 1:, None]  # (B, C, H) offsets in flat
    return windows.index_select(0, starts.flatten()).view(batch, channels, height, width)
