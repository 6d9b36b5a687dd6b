"""An agent's whole update as one compiled graph (`runtime.compile_update`).

`torch.compile(fullgraph=True)` compiles the mode's update (forward, gradients, Adam steps, target EMAs, the
candidate queue and the k-NN reward): a graph break is an error (`ConfigError`, one line naming the agent and
torch's reason), never a silent split. Which parts run at a step
(`UpdateParts`) is decided on the host, so each combination is one graph, compiled the first time it is met.
Random draws fall back to PyTorch's own kernels (inductor's `fallback_random`), so a compiled update draws the
same numbers as the eager one and the two differ only by the rounding of fused arithmetic. That needs the draws in
the eager order too: before torch 2.13 inductor does not keep such draws in program order (its scheduler's
peak-memory ordering moved the candidates' exponential draw past the critic's normal one, on torch 2.11), so there
the passes that reorder operations are off (`inductor_options`). Any later compilation
(a recompilation: a shape, a dtype or a guarded value that changed) is logged in one line and allowed. A run
compiles one agent at a time: a new compiled update drops the compiled code of the agents before it, whose phases
have ended (torch keeps a limited number of graphs per function, and past it would run a later phase's update
eagerly, unannounced). With
`cuda_graphs`, each graph is replayed as a CUDA graph; its metrics are copied out of the graph's memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from protorl.agents.sac import Metrics, UpdateParts
from protorl.errors import ConfigError
from protorl.replay import Batch

log = logging.getLogger("protorl")


def parts_key(parts: UpdateParts) -> tuple[bool, ...]:
    """What tells one compiled graph of an update from another."""
    return (parts.actor, parts.critic_target, parts.anchor is not None, parts.ssl, parts.encoder_target)


def inductor_options(cuda_graphs: bool) -> dict[str, bool]:
    """Inductor's options for a compiled update: random draws by PyTorch's own kernels (`fallback_random`), in the
    eager order. From torch 2.13 on, inductor chains such draws in program order itself; before it, nothing stops
    its passes that reorder independent operations (for locality, for peak memory, for fewer CUDA graph
    partitions) from moving one draw past another, so that each gets the other's numbers: those passes are off."""
    options = {"fallback_random": True, "triton.cudagraphs": cuda_graphs}
    if torch.__version__ < (2, 13):
        options.update({"reorder_for_locality": False, "reorder_for_peak_memory": False,
                        "triton.reorder_for_reducing_graph_partitions": False})
    return options


class CompiledUpdate:
    """`update(batch, parts)` compiled whole, one graph per `parts_key`; recompilations are counted and logged."""

    def __init__(self, update: Callable[[Batch, UpdateParts], Metrics], name: str, cuda_graphs: bool = False):
        self.name, self.cuda_graphs = name, cuda_graphs
        torch.compiler.reset()  # the agents before this one are done (the module's docstring)
        self.compiled = torch.compile(update, fullgraph=True, options=inductor_options(cuda_graphs))
        self.graphs: set[tuple[bool, ...]] = set()  # the combinations compiled so far
        self.recompilations = 0

    def __call__(self, batch: Batch, parts: UpdateParts) -> Metrics:
        key = parts_key(parts)
        if key not in self.graphs:  # its first compilation, expected
            try:
                metrics = self._copied(self.compiled(batch, parts))
            except Exception as error:
                if not type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
                    raise
                reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
                raise ConfigError(f"runtime.compile_update=true: the update of {self.name} does not compile as one "
                                  f"graph ({reason}); run without runtime.compile_update") from error
            self.graphs.add(key)
            return metrics
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._copied(self.compiled(batch, parts))
        except RuntimeError as error:
            if "recompil" not in str(error).lower():
                raise
            reason = str(error).strip().splitlines()[0][:300]
        self.recompilations += 1
        log.warning("compiled update of %s recompiled (%d so far; each takes seconds): %s", self.name,
                    self.recompilations, reason)
        return self._copied(self.compiled(batch, parts))

    def _copied(self, metrics: Metrics) -> Metrics:
        """CUDA graphs overwrite their outputs at the next replay: the metrics leave in one copy."""
        if not self.cuda_graphs:
            return metrics
        values = torch.stack([value.float() for value in metrics.values()])
        return dict(zip(metrics, values.unbind(), strict=True))
