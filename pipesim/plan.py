"""The parallel plan: tensor parallelism inside a stage, pipeline stages, layer split.

GPUs are numbered as the engines number ranks: stage s holds GPUs s*tp .. s*tp+tp-1.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import require


@dataclass(frozen=True)
class Plan:
    tp: int
    pp: int
    layers_per_stage: tuple[int, ...]

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def stage_gpus(self, stage: int) -> tuple[int, ...]:
        return tuple(range(stage * self.tp, (stage + 1) * self.tp))

    def stage_layers(self, stage: int) -> range:
        start = sum(self.layers_per_stage[:stage])
        return range(start, start + self.layers_per_stage[stage])


def partition(num_layers: int, pp: int, rule: str) -> tuple[int, ...]:
    """Layers per stage by an engine's rule.

    - "sglang": equal split, the last `num_layers % pp` stages get one more layer
      (Kimi's 61 layers on PP8: 7,7,7,8,8,8,8,8);
    - "vllm": equal split, the remainder given one layer each to the stages before the
      last, counting back from the second-to-last (vllm/distributed/utils.py
      get_pp_indices: `partitions[-i] += 1 for i in range(2, remainder + 2)`).
    """
    base, extra = divmod(num_layers, pp)
    if rule == "sglang":
        return tuple(base + (1 if s >= pp - extra else 0) for s in range(pp))
    if rule == "vllm":
        parts = [base] * pp
        for i in range(2, extra + 2):
            parts[-i] += 1
        return tuple(parts)
    raise ValueError(f"unknown partition rule {rule}")


def make_plan(
    tp: int, pp: int, num_layers: int, gpu_count: int, rule: str, layers: tuple[int, ...] | None = None
) -> Plan:
    require(isinstance(tp, int) and tp >= 1, f"tp must be a whole number >= 1, got {tp}")
    require(isinstance(pp, int) and pp >= 1, f"pp must be a whole number >= 1, got {pp}")
    require(
        tp * pp <= gpu_count,
        f"tp x pp = {tp} x {pp} = {tp * pp} GPUs, but the box has {gpu_count}; allowed: tp x pp <= {gpu_count}",
    )
    require(
        pp <= num_layers,
        f"pp={pp} is more stages than the model's {num_layers} layers; allowed: pp <= {num_layers}",
    )
    if layers is None:
        layers = partition(num_layers, pp, rule)
    else:
        require(len(layers) == pp, f"--layers gives {len(layers)} stages but pp={pp}")
        require(
            all(n >= 1 for n in layers),
            f"--layers {','.join(map(str, layers))}: every stage needs at least one layer",
        )
        require(
            sum(layers) == num_layers,
            f"--layers {','.join(map(str, layers))} sums to {sum(layers)}, the model has {num_layers} layers",
        )
    return Plan(tp, pp, tuple(layers))
