"""Auto γ among token trees: a tree shape is chosen when its measured speed-up beats the chains'.

Section 3.1's model has no counterpart for a tree, so a tree is judged on its own timed calls, in
the controller's units: ρ_b · Σ_i baseline_call(L_i) / Σ_i wall_i over its calls (as
`GammaController.measured_speedup` measures a γ). Every call of the chosen tree enters its
estimate, so a tree timed too fast stops being chosen once its own calls say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_t5x.auto import gamma_controller

# The controller's measurement calls: taken as they are (they time the baseline or a chain).
MEASUREMENTS = ("probe", "time_baseline", "retime_baseline", "retime_speculative")


def plan_name(plan) -> str:
    """An auto plan's name in rows and histories: γ as '2', a tree as `tree.tree_name` gives it
    ('tree(3,2,1)', 'tree[0,1,00]'), a name as is.

    Raises:
      ValueError: neither an int γ >= 0, a tuple or list of ints, nor a str.
    """
    if isinstance(plan, str):
        return plan
    if isinstance(plan, int | np.integer) and not isinstance(plan, bool) and plan >= 0:
        return str(int(plan))
    if isinstance(plan, tuple | list) and plan:
        from specdec_t5x import tree as tree_lib  # local: imports the network

        try:
            return tree_lib.tree_name(plan)
        except (TypeError, ValueError):
            pass
    raise ValueError(
        f"an auto plan is an int γ >= 0 or a tree shape (branching factors or child-rank paths); "
        f"got {plan!r}."
    )


@dataclasses.dataclass
class TreeChooser:
    """Chooses between the controller's chain choice and the measured tree shapes.

    Attributes:
      controller: the chains' `GammaController` (its config's `tree_margin` is the margin).
      shapes: the candidate trees (`tree.TreeShape` specs).
      terms: {shape: [timed calls, Σ modelled baseline ms at their lengths, Σ wall ms]}.

    Raises:
      ValueError: no shapes, or a shape that is not a tree.
    """

    controller: gamma_controller.GammaController
    shapes: tuple[tuple[int, ...], ...]
    terms: dict = gamma_controller.running_field(dict)

    def __post_init__(self):
        self.shapes = tuple(
            tuple(tuple(p) if isinstance(p, list | tuple) else p for p in s) for s in self.shapes
        )
        if not self.shapes:
            raise ValueError("TreeChooser needs at least one tree shape; got none.")
        for shape in self.shapes:
            plan_name(shape)  # raises on a bad shape

    def time_tree(self, shape: Sequence[int], seconds: float, longest_tokens: int) -> None:
        """Adds a timed call of `shape` (one of `shapes`): wall `seconds` (>= 0), its longest
        row's tokens (>= 1). Raises ValueError otherwise."""
        shape = tuple(shape)
        if shape not in self.shapes:
            raise ValueError(f"unknown tree {shape!r}; the candidates are {self.shapes}.")
        gamma_controller.check_call("time_tree", seconds, longest_tokens)
        terms = self.terms.setdefault(shape, [0, 0.0, 0.0])
        terms[0] += 1
        terms[1] += self.controller.curve.baseline_call_ms(int(longest_tokens))
        terms[2] += 1e3 * float(seconds)

    def measured_speedup(self, shape: Sequence[int]) -> float | None:
        """ρ_b · Σ baseline_call(L_i) / Σ wall_i over the tree's timed calls; None before one
        call of it and `min_timed_calls` baseline timings."""
        terms = self.terms.get(tuple(shape))
        timed_baseline = self.controller.timed_calls.get(0, 0)
        if (
            terms is None
            or terms[2] <= 0
            or timed_baseline < self.controller.config.min_timed_calls
        ):
            return None
        return self.controller.corrections()["baseline"] * terms[1] / terms[2]

    def best_tree(self) -> tuple[tuple[int, ...], float] | None:
        """(shape, measured speed-up) of the fastest timed tree (ties: the earlier), or None."""
        measured = [(s, m) for s in self.shapes if (m := self.measured_speedup(s)) is not None]
        return max(measured, key=lambda sm: sm[1], default=None)

    def choose(self) -> tuple[int | tuple[int, ...], float | None]:
        """(plan, its predicted or measured speed-up): γ (0 = off) or a tree shape.

        The controller's choice, its measurement calls as they are; the best tree instead when
        its measured speed-up exceeds `tree_margin` times the chains' (the chosen γ's prediction
        or measured speed-up, at least 1), except that every `speculate_every`-th call re-times
        that γ and the baseline is re-timed by the controller's rule ('retime_baseline').
        `controller.last_choice['reason']` is 'tree' for a tree.
        """
        c, cfg = self.controller, self.controller.config
        gamma, predicted = c.choose()
        best = self.best_tree()
        if c.last_choice["reason"] in MEASUREMENTS or best is None:
            return gamma, predicted
        chains = 1.0
        if gamma > 0:
            measured = c.measured_speedup(gamma)
            chains = max(chains, predicted or 0.0, measured[0] if measured else 0.0)
        shape, speedup = best
        if speedup <= cfg.tree_margin * chains:
            return gamma, predicted
        if (
            gamma > 0
            and cfg.speculate_every
            and c.calls_since_speculative + 1 >= cfg.speculate_every
        ):
            c.last_choice = {**c.last_choice, "reason": "retime_speculative"}
            return gamma, predicted
        c.exploring = False  # the tree is not the exploration the controller chose
        if c.timed_calls.get(0, 0) >= cfg.min_timed_calls and c.retime_baseline(speedup):
            c.last_choice = {"reason": "retime_baseline", "alpha": c.alpha, "predicted": None}
            return 0, None
        c.last_choice = {"reason": "tree", "alpha": c.alpha, "predicted": speedup}
        return shape, speedup

    def observe(
        self, shape: Sequence[int], seconds: float, longest_tokens: int, iterations=None
    ) -> None:
        """Records a timed call of a tree: its estimate (`time_tree`) and the controller's L,
        history and re-timing counters (`observe_unmodelled`)."""
        self.time_tree(shape, seconds, longest_tokens)
        self.controller.observe_unmodelled(plan_name(shape), seconds, longest_tokens, iterations)
