"""Throughput and memory of protorl's agent updates against the limit measured on this machine, in one run.

The limit of an update is its unavoidable work at the fastest rates this run can find here: the encoder
convolutions (3 forward passes and 1 backward pre-training, 2 forward passes downstream, at the best
throughput over micro-batch sizes and memory layouts) plus every matrix product the update computes (each
shape timed on its own, best layout). Each update measurement runs in a fresh subprocess so allocator settings
and peak memory do not leak between rows. The baseline is the paper-faithful update written the common way
(the official code's structure): 4 online encoder forwards + 1 target forward per step, float
replicate-pad + crop augmentation, a (B, Q, D) broadcast for the k-NN, PyTorch's default Adam,
default tensor layout, and glibc's default malloc. It shares protorl's networks and math otherwise.
Two further updates are run with every convolution and matrix product timed as the update runs it: how far
those alone are from their limit, and what the rest of the update (augmentation, conversions, optimisers,
Sinkhorn, the k-NN, diagnostics, Python) costs.

    python benchmarks/bench_update.py                 # all rows (2-15 minutes on 2 CPU cores)
    python benchmarks/bench_update.py --quick         # batch 32 rows and env/replay figures only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MICRO_BATCHES = (4, 8, 16, 32, 64, 128, 256, 512)  # searched for the encoder's fastest convolutions
MATMULS = ("mm", "addmm", "bmm", "baddbmm")  # the aten products whose shapes an update's limit times
CONVOLUTIONS = ("convolution", "convolution_backward")  # the encoder's, timed as the update runs them


def _build(batch_size: int, phase: str, seed: int = 0):
    import numpy as np
    import torch

    from protorl.agents import ProtoAgent
    from protorl.agents.proto.agent import ProtoConfig
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

    from protorl.agents.networks import soft_update
    from protorl.agents.proto.math import cluster_assignment_loss, sample_candidates, sinkhorn

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
    agent.sac.update(features, batch.action, reward, batch.discount, next_features, agent.sac.parts(step))


def _worker(kind: str, batch_size: int, phase: str, steps: int) -> dict:
    """Runs in a subprocess: seconds per update over `steps` updates (even) after 2 warm-up updates, and the
    protorl package it imported; for kind "protorl" also what its convolutions and matrix products take, inside
    the update and at their best (`_products`). Kinds: "baseline", "protorl", "protorl-speed" (the seconds only;
    benchmarks/paired_update.py), "protorl-default-malloc" (with glibc's default mmap behaviour)."""
    import copy

    import torch

    import protorl

    if kind in ("protorl", "protorl-speed"):
        from protorl.runtime import tune_malloc

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
    steps += steps % 2  # as many even steps as odd ones: the actor and the EMAs update on every 2nd
    start = time.perf_counter()
    for step in range(2, 2 + steps):
        update(step)
    result = {"seconds_per_update": (time.perf_counter() - start) / steps, "peak_rss_mb": _peak_rss_mb(),
              "protorl": protorl.__file__}
    if kind == "protorl":
        result.update(_products(update, (2 + steps, 3 + steps)))
    return result


def _products(update, steps: tuple[int, ...]) -> dict:
    """The convolutions and matrix products of `update(step)` for each of `steps` (forward and backward): the
    seconds they took as the update ran them ("conv_in_update_s", "matmul_in_update_s"), and the seconds of its
    matrix products at their best ("matmul_limit_s"), each shape timed on its own at the best of its own memory
    layout and a contiguous one; and the six other aten operations that took longest inside the update
    ("other_ops_s"). All per update."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: dict[tuple, int] = {}  # (op, operand shapes and strides, or other arguments) -> times called
    seconds: dict[str, float] = {}  # aten op -> seconds inside the update

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in MATMULS:
                key = (func, tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a
                                   for a in args))
                calls[key] = calls.get(key, 0) + 1
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
            return out

    with Record():
        for step in steps:
            update(step)

    def operand(spec, contiguous: bool):
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], tuple)):
            return spec  # a scalar argument (beta, alpha)
        shape, stride = spec
        if contiguous or len(shape) < 2 or stride[-1] == 1:
            return torch.randn(shape)
        return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)  # a transposed operand

    limit = 0.0
    for (func, specs), count in calls.items():
        timings = []
        for contiguous in (False, True):
            args = [operand(spec, contiguous) for spec in specs]
            timings.append(_best_of(5, lambda func=func, args=args: func(*args), warmup=1))
        limit += count * min(timings)
    per_update = {name: total / len(steps) for name, total in seconds.items()}
    others = sorted((name for name in per_update if name not in MATMULS + CONVOLUTIONS), key=per_update.get,
                    reverse=True)
    return {"matmul_limit_s": limit / len(steps),
            "conv_in_update_s": sum(per_update.get(name, 0.0) for name in CONVOLUTIONS),
            "matmul_in_update_s": sum(per_update.get(name, 0.0) for name in MATMULS),
            "other_ops_s": {name: per_update[name] for name in others[:6]}}


def _best_of(repeats: int, fn, warmup: int = 0) -> float:
    """The shortest of `repeats` timed calls of fn(), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it is not inherited across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _conv_search(samples: int = 512) -> dict:
    """Runs in a subprocess: seconds per sample of the encoder's convolutions, forward (no gradient) and
    forward + backward (weight gradients, and input gradients of layers 2-4), for every micro-batch of
    `MICRO_BATCHES` and both memory layouts, `samples` samples per measurement, best of 2; and their FLOPs."""
    import torch

    from protorl.agents.networks import PixelEncoder
    from protorl.runtime import tune_malloc

    tune_malloc()
    convnet = PixelEncoder((9, 84, 84)).convnet
    table = []
    for layout, name in ((torch.channels_last, "channels-last"), (torch.contiguous_format, "NCHW")):
        convnet.to(memory_format=layout)
        for micro in MICRO_BATCHES:
            x = torch.rand(micro, 9, 84, 84).contiguous(memory_format=layout)
            chunks = max(samples // micro, 1)
            with torch.no_grad():
                fwd = _best_of(2, lambda x=x, n=chunks: [convnet(x) for _ in range(n)], warmup=1)
            fwd_bwd = _best_of(2, lambda x=x, n=chunks: [convnet(x).sum().backward() for _ in range(n)], warmup=1)
            table.append({"layout": name, "micro": micro, "fwd_s": fwd / (chunks * micro),
                          "fwd_bwd_s": fwd_bwd / (chunks * micro)})
    return {"table": table, "fwd_flop": _conv_flop(convnet, backward=False),
            "fwd_bwd_flop": _conv_flop(convnet, backward=True)}


def _conv_flop(convnet, backward: bool) -> float:
    """FLOPs per 9x84x84 sample: 2 x the MACs of every conv layer; backward adds every layer's weight gradient
    and the input gradient of all but the first (its input is data)."""
    import torch
    from torch import nn

    flop, x, first = 0.0, torch.zeros(1, 9, 84, 84), True
    with torch.no_grad():
        for layer in convnet:
            y = layer(x)
            if isinstance(layer, nn.Conv2d):
                macs = y.numel() * layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
                flop += 2 * macs * (1 + backward + (backward and not first))
                first = False
            x = y
    return flop


def _conv_limit(search: dict, phase: str, batch: int) -> tuple[float, dict, dict]:
    """Seconds of an update's unavoidable convolutions, each pass at the best rate found for micro-batches up to
    its size; and the fastest forward and forward+backward settings used."""
    def fastest(samples: int, key: str) -> dict:
        return min((row for row in search["table"] if row["micro"] <= samples), key=lambda row: row[key])

    fwd_bwd = fastest(batch, "fwd_bwd_s")
    if phase == "pretrain":  # x_{t+1} through the online and the target encoder; x_t forward and backward
        fwd = fastest(batch, "fwd_s")
        return batch * (2 * fwd["fwd_s"] + fwd_bwd["fwd_bwd_s"]), fwd, fwd_bwd
    fwd = fastest(2 * batch, "fwd_s")  # downstream: x_t and x_{t+1} in one frozen pass
    return 2 * batch * fwd["fwd_s"], fwd, fwd_bwd


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


def _diagnostics_ms(batch_size: int, repeats: int = 50) -> float:
    """Milliseconds for one update's collapse diagnostics (protorl.agents.diagnostics), M = 512, D = 128."""
    import torch
    import torch.nn.functional as F

    from protorl.agents.diagnostics import projection_diagnostics, sinkhorn_entropy

    raw, prototypes = torch.randn(batch_size, 128), F.normalize(torch.randn(512, 128), dim=1)
    q = torch.softmax(torch.randn(batch_size, 512), dim=1)
    for _ in range(3):
        projection_diagnostics(raw, raw, prototypes), sinkhorn_entropy(q)
    start = time.perf_counter()
    for _ in range(repeats):
        projection_diagnostics(raw, raw, prototypes), sinkhorn_entropy(q)
    return (time.perf_counter() - start) / repeats * 1e3


def _run_worker(*args, checkout: Path | None = None) -> dict:
    """`_worker(*args)` in a fresh process; with `checkout`, importing that checkout's protorl (checked). The
    process then starts outside any checkout: a working directory inside one would shadow PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as outside:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", *map(str, args)],
                             capture_output=True, text=True, env=env, check=True,
                             cwd=outside if checkout is not None else None)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if checkout is not None and not Path(result["protorl"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"imported {result['protorl']}, not the checkout {checkout}")
    return result


def _print_conv_search(search: dict) -> None:
    fwd_gflop, fwd_bwd_gflop = search["fwd_flop"] / 1e9, search["fwd_bwd_flop"] / 1e9
    print(f"encoder convolutions per 9x84x84 sample: forward {fwd_gflop * 1e3:.1f} MFLOP, forward+backward "
          f"{fwd_bwd_gflop * 1e3:.1f} MFLOP; GFLOP/s by micro-batch (512 samples per measurement):")
    print("| layout | " + " | ".join(f"{row['micro']}" for row in search["table"] if row["layout"] == "NCHW")
          + " |")
    print("|---|" + "---|" * len(MICRO_BATCHES))
    for layout in ("channels-last", "NCHW"):
        for key, gflop in (("fwd_s", fwd_gflop), ("fwd_bwd_s", fwd_bwd_gflop)):
            rates = [f"{gflop / row[key]:.0f}" for row in search["table"] if row["layout"] == layout]
            print(f"| {layout}, {'forward' if key == 'fwd_s' else 'fwd+bwd'} | " + " | ".join(rates) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the batch-512 rows")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "conv-search":
            print(json.dumps(_conv_search()))
        else:
            batch, phase, steps = rest
            print(json.dumps(_worker(kind, int(batch), phase, int(steps))))
        return

    import torch

    from protorl.agents.networks import CPU_MICRO_BATCH

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    search = _run_worker("conv-search")
    _print_conv_search(search)
    print(f"(protorl convolves in micro-batches of {CPU_MICRO_BATCH} on a CPU: "
          "protorl.agents.networks.CPU_MICRO_BATCH)\n")

    print("| update | batch | baseline s/update | protorl s/update | protorl updates/s | speed-up | limit s (conv + "
          "matmul) | protorl / limit | in the update: conv + matmul s (/ limit) | in the update: the rest s | "
          "fastest conv (fwd; fwd+bwd) | peak RSS MB (baseline / protorl) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    batches = [32] if args.quick else [512, 32]
    malloc_note, rest_notes = "", []
    for batch in batches:
        for phase in ("pretrain", "finetune"):
            steps = 4 if batch == 512 else 20
            base = _run_worker("baseline", batch, phase, steps) if phase == "pretrain" else None
            ours = _run_worker("protorl", batch, phase, steps)
            conv_s, fwd, fwd_bwd = _conv_limit(search, phase, batch)
            limit = conv_s + ours["matmul_limit_s"]
            if phase == "pretrain" and batch == 512:
                plain = _run_worker("protorl-default-malloc", batch, phase, steps)
                malloc_note = (f"glibc default malloc: {plain['seconds_per_update']:.3f} s/update, "
                               f"{plain['seconds_per_update'] / ours['seconds_per_update']:.2f}x slower than tuned")
            base_s = f"{base['seconds_per_update']:.3f}" if base else "-"
            speedup = f"{base['seconds_per_update'] / ours['seconds_per_update']:.2f}x" if base else "-"
            rss = f"{base['peak_rss_mb']:.0f} / {ours['peak_rss_mb']:.0f}" if base else f"- / {ours['peak_rss_mb']:.0f}"
            best = f"{fwd['layout']} {fwd['micro']}; {fwd_bwd['layout']} {fwd_bwd['micro']}"
            products = ours["conv_in_update_s"] + ours["matmul_in_update_s"]
            print(f"| {phase} | {batch} | {base_s} | {ours['seconds_per_update']:.3f} | "
                  f"{1 / ours['seconds_per_update']:.2f} | {speedup} | {limit:.3f} ({conv_s:.3f} + "
                  f"{ours['matmul_limit_s']:.3f}) | {ours['seconds_per_update'] / limit:.2f} | {products:.3f} "
                  f"({ours['conv_in_update_s']:.3f} + {ours['matmul_in_update_s']:.3f}; {products / limit:.2f}) | "
                  f"{ours['seconds_per_update'] - products:.3f} | {best} | {rss} |", flush=True)
            rest_notes.append(f"{phase} {batch}: " + ", ".join(
                f"{name} {seconds * 1e3:.1f}" for name, seconds in ours["other_ops_s"].items()))

    print("\nthe rest of each update: its longest other aten operations, ms per update (the remainder is Python and "
          "dispatch)")
    for note in rest_notes:
        print(f"- {note}")
    if malloc_note:
        print(f"\npretrain update at batch 512 with protorl.runtime.tune_malloc() skipped: {malloc_note}")
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
