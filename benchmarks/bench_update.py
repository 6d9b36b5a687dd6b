"""Throughput and memory of protorl's agent updates, environment and replay buffer.

Prints one table. Each update measurement runs in a fresh subprocess so allocator settings and peak
memory do not leak between rows. The baseline is the paper-faithful update written the common way
(the official code's structure): 4 online encoder forwards + 1 target forward per step, float
replicate-pad + crop augmentation, a (B, Q, D) broadcast for the k-NN, PyTorch's default Adam,
default tensor layout, and glibc's default malloc. It shares protorl's networks and math otherwise.

    python benchmarks/bench_update.py                 # all rows (about 10 minutes on 2 CPU cores)
    python benchmarks/bench_update.py --quick         # batch 32 rows and env/replay figures only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CONV_FWD_MFLOP = 84.6  # encoder forward per 9x84x84 sample (4 conv layers)
CONV_BWD_MFLOP = 160.0  # weight grads of all layers + input grads of layers 2-4


def _build(batch_size: int, phase: str, seed: int = 0):
    import numpy as np
    import torch

    from protorl.agents import ProtoAgent
    from protorl.agents.proto import ProtoConfig
    from protorl.replay import ReplayBuffer

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    obs_shape, action_shape = (9, 84, 84), (6,)
    replay = ReplayBuffer((3, 84, 84), np.uint8, action_shape, capacity=4096, frame_stack=3, seed=seed)
    for _ in range(4):
        replay.add_first(rng.integers(0, 256, (3, 84, 84), dtype=np.uint8))
        for _ in range(1000):
            replay.add(rng.integers(0, 256, (3, 84, 84), dtype=np.uint8), rng.uniform(-1, 1, 6), 0.0, 1.0)
    agent = ProtoAgent("pixels", obs_shape, action_shape, ProtoConfig(batch_size=batch_size),
                       torch.device("cpu"), "frozen" if phase == "finetune" else phase)
    return agent, replay


def _baseline_update(agent, replay, step: int, state: dict) -> None:
    """The update as commonly written (official Proto-RL structure), on protorl's modules."""
    import torch
    import torch.nn.functional as F

    from protorl.networks import soft_update
    from protorl.proto import cluster_assignment_loss, sample_candidates, sinkhorn

    cfg = agent.cfg
    encoder = state["encoder"]  # protorl's conv layers in the default (NCHW) layout

    def encode(x):
        return encoder(x / 255.0).flatten(1)

    def augment(x):
        pad = cfg.augment_pad
        padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        shifts = torch.randint(0, 2 * pad + 1, (x.shape[0], 2))
        return torch.stack([padded[i, :, dy:dy + x.shape[2], dx:dx + x.shape[3]]
                            for i, (dy, dx) in enumerate(shifts.tolist())])

    batch = replay.sample(cfg.batch_size)
    obs, next_obs = augment(batch.obs.float()), augment(batch.next_obs.float())
    head = agent.head
    if step % cfg.encoder_target_update_every == 0:
        soft_update(encoder, state["encoder_target"], cfg.encoder_target_tau)
        soft_update(head.projector, agent.projector_target, cfg.encoder_target_tau)
    # representation update: online forward 1 (with grad) and the target forward
    head.normalize_prototypes_()
    u = F.normalize(head.predictor(head.projector(encode(obs))), dim=1)
    log_p = F.log_softmax(u @ head.prototypes.t() / cfg.temperature, dim=1)
    with torch.no_grad():
        target = state["encoder_target"](next_obs / 255.0).flatten(1)
        z_t = F.normalize(agent.projector_target(target), dim=1)
        q = sinkhorn(z_t @ head.prototypes.t() / cfg.temperature, cfg.sinkhorn_iters)
    loss = cluster_assignment_loss(log_p, q)
    state["repr_optimizer"].zero_grad()
    loss.backward()
    state["repr_optimizer"].step()
    with torch.no_grad():
        # intrinsic reward: online forward 2, k-NN by broadcasting (B, Q, D)
        z = head.project(encode(next_obs))
        agent.queue.enqueue(sample_candidates(z, head.prototypes))
        distances = torch.norm(z[:, None, :] - agent.queue.filled()[None, :, :], dim=-1)
        reward = distances.topk(cfg.knn_k, dim=1, largest=False).values[:, -1:]
        # RL features: online forwards 3 and 4
        features, next_features = encode(obs), encode(next_obs)
    agent.sac.update(features, batch.action, reward, batch.discount, next_features, step)


def _worker(kind: str, batch_size: int, phase: str, steps: int) -> dict:
    """Runs in a subprocess: time `steps` updates after 2 warm-up updates."""
    import copy

    import torch

    if kind == "protorl":  # "protorl-default-malloc": the same update with glibc's default mmap behaviour
        from protorl.utils import tune_malloc

        tune_malloc()
    agent, replay = _build(batch_size, phase)
    if kind == "baseline":
        encoder = copy.deepcopy(agent.encoder.convnet).to(memory_format=torch.contiguous_format)
        state = {"encoder": encoder, "encoder_target": copy.deepcopy(encoder).requires_grad_(False),
                 "repr_optimizer": torch.optim.Adam([*encoder.parameters(), *agent.head.parameters()],
                                                    lr=agent.cfg.lr, fused=False, foreach=False)}
        sac = agent.sac
        sac.actor_optimizer = torch.optim.Adam(sac.actor.parameters(), lr=agent.cfg.lr, foreach=False)
        sac.critic_optimizer = torch.optim.Adam(sac.critic.parameters(), lr=agent.cfg.lr, foreach=False)

        def update(step):
            _baseline_update(agent, replay, step, state)
    elif kind.startswith("protorl"):
        def update(step):
            agent.update(replay.sample(batch_size), step)
    else:
        raise ValueError(f"unknown benchmark kind {kind!r}")

    for step in range(2):
        update(step)
    start = time.perf_counter()
    for step in range(2, 2 + steps):
        update(step)
    seconds = (time.perf_counter() - start) / steps
    return {"seconds_per_update": seconds, "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it is not inherited across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _conv_throughput() -> dict:
    """GFLOP/s of the encoder alone at batch 512 (channels-last, tuned malloc), forward and fwd+bwd."""
    import torch

    from protorl.networks import PixelEncoder
    from protorl.utils import tune_malloc

    tune_malloc()
    encoder = PixelEncoder((9, 84, 84))
    x = torch.randint(0, 256, (512, 9, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        encoder(x)
        start = time.perf_counter()
        for _ in range(3):
            encoder(x)
        fwd = (time.perf_counter() - start) / 3
    encoder(x).sum().backward()
    start = time.perf_counter()
    for _ in range(2):
        encoder(x).sum().backward()
    fwd_bwd = (time.perf_counter() - start) / 2
    return {"fwd_gflops": 512 * CONV_FWD_MFLOP / fwd / 1e3,
            "fwd_bwd_gflops": 512 * (CONV_FWD_MFLOP + CONV_BWD_MFLOP) / fwd_bwd / 1e3}


def _env_fps(task: str, obs: str, steps: int = 200) -> float:
    import numpy as np

    from protorl.envs import DMCEnv

    env = DMCEnv(task, obs=obs)
    env.reset()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        if env.step(rng.uniform(-1, 1, env.action_shape)).last:
            env.reset()
    return steps * env.action_repeat / (time.perf_counter() - start)


def _run_worker(kind: str, batch_size: int, phase: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, __file__, "--worker", kind, str(batch_size), phase, str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _diagnostics_ms(batch_size: int, repeats: int = 50) -> float:
    """Milliseconds for one update's collapse diagnostics (protorl.diagnostics) at the paper's M = 512, D = 128."""
    import torch
    import torch.nn.functional as F

    from protorl.diagnostics import projection_diagnostics, sinkhorn_entropy

    raw, prototypes = torch.randn(batch_size, 128), F.normalize(torch.randn(512, 128), dim=1)
    q = torch.softmax(torch.randn(batch_size, 512), dim=1)
    for _ in range(3):
        projection_diagnostics(raw, raw, prototypes), sinkhorn_entropy(q)
    start = time.perf_counter()
    for _ in range(repeats):
        projection_diagnostics(raw, raw, prototypes), sinkhorn_entropy(q)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the batch-512 rows")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "BATCH", "PHASE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, batch, phase, steps = args.worker
        print(json.dumps(_worker(kind, int(batch), phase, int(steps))))
        return

    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    conv = _conv_throughput()
    print(f"encoder conv throughput at batch 512: forward {conv['fwd_gflops']:.0f} GFLOP/s, "
          f"forward+backward {conv['fwd_bwd_gflops']:.0f} GFLOP/s\n")

    print("| update | batch | baseline s/update | protorl s/update | protorl updates/s | speed-up | "
          "conv-FLOP limit s (at 115 GFLOP/s) | protorl / limit | peak RSS MB (baseline / protorl) |")
    print("|---|---|---|---|---|---|---|---|---|")
    batches = [32] if args.quick else [512, 32]
    malloc_note = ""
    for batch in batches:
        for phase in ("pretrain", "finetune"):
            steps = 3 if batch == 512 else 20
            base = _run_worker("baseline", batch, phase, steps) if phase == "pretrain" else None
            ours = _run_worker("protorl", batch, phase, steps)
            conv_mflop = (3 * CONV_FWD_MFLOP + CONV_BWD_MFLOP) if phase == "pretrain" else 2 * CONV_FWD_MFLOP
            limit = batch * conv_mflop / 115e3
            if phase == "pretrain" and batch == 512:
                plain = _run_worker("protorl-default-malloc", batch, phase, steps)
                malloc_note = (f"glibc default malloc: {plain['seconds_per_update']:.3f} s/update, "
                               f"{plain['seconds_per_update'] / ours['seconds_per_update']:.2f}x slower than tuned")
            base_s = f"{base['seconds_per_update']:.3f}" if base else "-"
            speedup = f"{base['seconds_per_update'] / ours['seconds_per_update']:.2f}x" if base else "-"
            rss = f"{base['peak_rss_mb']:.0f} / {ours['peak_rss_mb']:.0f}" if base else f"- / {ours['peak_rss_mb']:.0f}"
            print(f"| {phase} | {batch} | {base_s} | {ours['seconds_per_update']:.3f} | "
                  f"{1 / ours['seconds_per_update']:.2f} | {speedup} | {limit:.3f} | "
                  f"{ours['seconds_per_update'] / limit:.2f} | {rss} |", flush=True)

    if malloc_note:
        print(f"\npretrain update at batch 512 with protorl.utils.tune_malloc() skipped: {malloc_note}")
    print("\n| environment | obs | env frames/s (action repeat 2, 84x84 render) |")
    print("|---|---|---|")
    for task in ("point_mass_easy", "walker_walk"):
        for obs in ("pixels", "states"):
            print(f"| {task} | {obs} | {_env_fps(task, obs):.0f} |", flush=True)

    batches = (32,) if args.quick else (32, 512)
    print("\ncollapse diagnostics (repr/*) per update: "
          + ", ".join(f"batch {b} {_diagnostics_ms(b):.2f} ms" for b in batches))

    import numpy as np

    from protorl.replay import ReplayBuffer

    replay = ReplayBuffer((3, 84, 84), np.uint8, (6,), capacity=10_000, frame_stack=3)
    official = 2 * 9 * 84 * 84 + 6 * 4 + 4 + 4  # obs and next_obs stacks, action, reward, not-done
    print(f"\nreplay bytes per transition at 9x84x84: protorl {replay.bytes_per_transition:,.0f}, "
          f"two stored stacks {official:,} ({official / replay.bytes_per_transition:.1f}x more); "
          f"100k transitions: {replay.bytes_per_transition * 1e5 / 2**30:.2f} GiB vs {official * 1e5 / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
