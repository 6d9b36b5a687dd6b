"""`ReplayBuffer` on synthetic frames whose pixels encode (episode, step, write index).

Frame (3, 4, 4) uint8: channel 0 = episode, channel 1 = step within the episode (0 = the reset frame),
channel 2 = absolute write index (kept < 256). The expected stacks are derived from the written history
alone, so nothing here depends on how the ring is laid out.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from protorl.replay import ReplayBuffer

FRAME_SHAPE = (3, 4, 4)


def _frame(episode: int, step: int, index: int) -> np.ndarray:
    frame = np.empty(FRAME_SHAPE, dtype=np.uint8)
    frame[0], frame[1], frame[2] = episode, step, index
    return frame


def _decode(stack: np.ndarray | torch.Tensor) -> list[tuple[int, int, int]]:
    """(3 * fs, 4, 4) stack -> [(episode, step, index)] oldest first; checks each frame is one write."""
    stack = stack.cpu().numpy() if isinstance(stack, torch.Tensor) else np.asarray(stack)  # from any device
    frames = stack.reshape(-1, *FRAME_SHAPE)
    out = []
    for frame in frames:
        assert (frame == frame[:, :1, :1]).all()  # every pixel of a channel carries the same tag
        out.append((int(frame[0, 0, 0]), int(frame[1, 0, 0]), int(frame[2, 0, 0])))
    return out


class Writer:
    """Writes episodes as a trainer would and remembers the absolute index of every (episode, step)."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer = buffer
        self.index_of: dict[tuple[int, int], int] = {}
        self.written: list[tuple[int, int]] = []  # (episode, step) per absolute index
        self.episodes = 0

    def episode(self, num_frames: int) -> None:
        ep = self.episodes
        self.episodes += 1
        for step in range(num_frames):
            index = len(self.written)
            assert index < 256
            self.index_of[(ep, step)] = index
            self.written.append((ep, step))
            frame = _frame(ep, step, index)
            if step == 0:
                self.buffer.add_first(frame)
            else:
                discount = 0.0 if step % 5 == 4 else 1.0
                self.buffer.add(frame, np.array([ep, step], dtype=np.float32), ep * 100 + step, discount)

    def expected_stack(self, episode: int, step: int, frame_stack: int) -> list[tuple[int, int, int]]:
        """The stack ending at (episode, step): the env repeats the reset frame before it."""
        steps = [max(step - frame_stack + 1 + j, 0) for j in range(frame_stack)]
        return [(episode, s, self.index_of[(episode, s)]) for s in steps]


def _buffer(capacity: int, frame_stack: int = 3, seed: int = 0) -> ReplayBuffer:
    return ReplayBuffer(FRAME_SHAPE, np.uint8, (2,), capacity=capacity, frame_stack=frame_stack, seed=seed)


def _check_batch(writer: Writer, batch, frame_stack: int) -> list[tuple[int, int]]:
    """Check every sampled transition against the written history; return their (episode, step) ends."""
    size = batch.obs.shape[0]
    assert batch.obs.shape == (size, 3 * frame_stack, 4, 4) and batch.obs.dtype == torch.uint8
    assert batch.next_obs.shape == batch.obs.shape and batch.next_obs.dtype == torch.uint8
    assert batch.action.shape == (size, 2) and batch.action.dtype == torch.float32
    assert batch.reward.shape == (size, 1) and batch.reward.dtype == torch.float32
    assert batch.discount.shape == (size, 1) and batch.discount.dtype == torch.float32
    ends = []
    for b in range(size):
        ep, step, _ = _decode(batch.next_obs[b])[-1]
        assert step >= 1  # no transition ends at an episode's first frame
        assert _decode(batch.next_obs[b]) == writer.expected_stack(ep, step, frame_stack)
        assert _decode(batch.obs[b]) == writer.expected_stack(ep, step - 1, frame_stack)
        assert batch.action[b].tolist() == [ep, step]
        assert batch.reward[b].item() == ep * 100 + step
        assert batch.discount[b].item() == (0.0 if step % 5 == 4 else 1.0)
        ends.append((ep, step))
    return ends


def test_add_before_add_first_raises():
    buffer = _buffer(10)
    with pytest.raises(RuntimeError):
        buffer.add(_frame(0, 1, 0), np.zeros(2, np.float32), 0.0, 1.0)


def test_empty_buffer_has_no_transitions():
    buffer = _buffer(10)
    assert len(buffer) == 0
    buffer.add_first(_frame(0, 0, 0))
    assert len(buffer) == 0
    with pytest.raises(RuntimeError):
        buffer.sample(4)


def test_stack_at_repeats_the_first_frame_and_never_crosses_episodes():
    buffer = _buffer(100)
    writer = Writer(buffer)
    for num_frames in (5, 2, 4, 6):
        writer.episode(num_frames)
    for index, (ep, step) in enumerate(writer.written):
        stack = buffer.stack_at(np.array([index]))
        assert stack.shape == (1, 9, 4, 4) and stack.dtype == np.uint8
        assert _decode(stack[0]) == writer.expected_stack(ep, step, 3)
    # explicitly: an episode's first stack is its first frame three times, the next one (f0, f0, f1)
    start = writer.index_of[(3, 0)]
    assert [s for _, s, _ in _decode(buffer.stack_at(np.array([start]))[0])] == [0, 0, 0]
    assert [s for _, s, _ in _decode(buffer.stack_at(np.array([start + 1]))[0])] == [0, 0, 1]
    assert [s for _, s, _ in _decode(buffer.stack_at(np.array([start + 3]))[0])] == [1, 2, 3]


@pytest.mark.parametrize("frame_stack", [1, 3])
def test_sampled_transitions_are_consecutive_stacks_of_one_episode(frame_stack):
    buffer = _buffer(100, frame_stack=frame_stack, seed=1)
    writer = Writer(buffer)
    for num_frames in (5, 2, 7, 4):
        writer.episode(num_frames)
    ends = set()
    for _ in range(10):
        ends.update(_check_batch(writer, buffer.sample(64), frame_stack))
    all_transitions = {(ep, step) for ep, step in writer.written if step > 0}
    assert ends == all_transitions


def test_len_counts_transitions_without_wraparound():
    buffer = _buffer(100)
    writer = Writer(buffer)
    expected = 0
    for num_frames in (5, 1, 4, 6):
        writer.episode(num_frames)
        expected += num_frames - 1  # add_first completes no transition
        assert len(buffer) == expected
    assert len(buffer) == 12


def test_wraparound_never_samples_overwritten_frames():
    capacity, frame_stack = 16, 3
    buffer = _buffer(capacity, frame_stack=frame_stack, seed=2)
    writer = Writer(buffer)
    for num_frames in (7, 9, 5, 8, 6):
        writer.episode(num_frames)
    total = len(writer.written)
    oldest_kept = total - capacity  # absolute indices < this were overwritten
    assert oldest_kept > 0
    sampled = Counter()
    for _ in range(40):
        batch = buffer.sample(64)
        for stack in list(batch.obs) + list(batch.next_obs):
            assert all(index >= oldest_kept for _, _, index in _decode(stack))
        sampled.update(_check_batch(writer, batch, frame_stack))
    # len() is exactly the number of distinct transitions sample() returns
    assert len(buffer) == len(sampled)
    # every transition whose frames (stacks unclamped) are all still stored is sampleable
    for ep, step in writer.written:
        end = writer.index_of[(ep, step)]
        if step > 0 and end - frame_stack >= oldest_kept:
            assert (ep, step) in sampled


def test_wraparound_len_hand_computed():
    # capacity 10: episode A (8 frames, absolute 0..7), episode B (6 frames, 8..13); slots keep 4..13.
    # A's transitions ending at steps 1..6 need a frame among 0..3 (gone); A7 needs 4..7 (kept);
    # B's five transitions all lie inside the ring.
    buffer = _buffer(10, frame_stack=3, seed=3)
    writer = Writer(buffer)
    writer.episode(8)
    writer.episode(6)
    assert len(buffer) == 6
    sampled = set()
    for _ in range(20):
        sampled.update(_check_batch(writer, buffer.sample(32), 3))
    assert sampled == {(0, 7), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)}


def test_sampling_is_uniform_over_transitions():
    buffer = _buffer(12, frame_stack=3, seed=4)
    writer = Writer(buffer)
    for num_frames in (5, 6, 7):  # 18 frames into 12 slots: wraps, and an episode start sits mid-ring
        writer.episode(num_frames)
    counts = Counter()
    draws = 0
    for _ in range(400):
        batch = buffer.sample(50)
        for reward in batch.reward[:, 0].tolist():
            counts[(int(reward) // 100, int(reward) % 100)] += 1
            draws += 1
    assert len(counts) == len(buffer) == 8
    expected = draws / len(counts)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 35.0, counts  # 7 degrees of freedom: p ~ 1e-5
    assert all(abs(c - expected) < 0.1 * expected for c in counts.values()), counts


def test_sampling_is_reproducible_with_the_seed():
    batches = []
    for _ in range(2):
        buffer = _buffer(50, seed=7)
        writer = Writer(buffer)
        writer.episode(20)
        batches.append(buffer.sample(16))
    assert torch.equal(batches[0].reward, batches[1].reward)
    assert torch.equal(batches[0].obs, batches[1].obs)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.mark.parametrize("device", DEVICES)
def test_frames_kept_on_a_device_give_the_host_buffers_batches(device):
    """With a copy of the frames on `device` (its own memory, even on the CPU), batches are gathered from that
    copy: every batch, across the ring's wraparound and a checkpoint's round trip, equals the host buffer's."""
    host, mirrored = _buffer(40, seed=3), ReplayBuffer(FRAME_SHAPE, np.uint8, (2,), 40, 3, seed=3, device=device)
    assert mirrored.device_frames.data_ptr() != torch.from_numpy(mirrored.frames).data_ptr()
    writers = Writer(host), Writer(mirrored)
    for length in (12, 30, 9):  # 51 frames into 40 slots
        for writer in writers:
            writer.episode(length)
        a, b = host.sample(16), mirrored.sample(16, device)
        assert b.obs.device.type == device and b.reward.device.type == device
        for name in ("obs", "next_obs", "action", "reward", "discount"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    _check_batch(writers[1], mirrored.sample(16, device), 3)
    restored = ReplayBuffer(FRAME_SHAPE, np.uint8, (2,), 40, 3, device=device)
    restored.load_state_dict(mirrored.state_dict())
    assert torch.equal(restored.sample(16, device).obs, mirrored.sample(16, device).obs)


def test_memory_per_transition_at_pixel_size():
    buffer = ReplayBuffer((3, 84, 84), np.uint8, (6,), capacity=1000, frame_stack=3)
    assert buffer.bytes_per_transition <= 25_000
    # independent of the buffer's own accounting: every array it holds
    held = sum(v.nbytes for v in vars(buffer).values() if isinstance(v, np.ndarray))
    assert held / 1000 <= 25_000
    assert buffer.nbytes == held
    # frames are stored once: two 9x84x84 stacks per transition would be 127 KB
    assert held >= 1000 * 3 * 84 * 84
