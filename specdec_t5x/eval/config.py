"""The eval job's settings, grouped: what to decode, how to speculate, what to measure.

`job.evaluate` takes these three frozen dataclasses and a `sampling.SamplingSettings`; gin binds
them from `gin/runs/eval.gin`'s macros (TASK, NUM_EXAMPLES, GAMMA, ...). A new feature adds a field
here, not a parameter to `evaluate`. Each validates itself on construction, so a bad value fails
before any model is loaded, with the gin macro it came from named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def _check_int(value, name: str, macro: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} (gin: {macro}) must be an int >= {minimum}; got {value!r}.")


def _check_bool(value, name: str, macro: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(
            f"{name} (gin: {macro}) takes True or False; got {value!r} ({type(value).__name__})."
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What the job decodes: the first `num_examples` examples of a seqio task split.

    Attributes:
      task: registered seqio task name (e.g. 'ddtp_ende', 'wmt_t2t_ende_v003').
      split: task split.
      num_examples: examples decoded (the first ones of the split, unshuffled; a split with fewer
        runs on all it has, with a warning recorded in `metrics['inputs']`).
      batch_size: examples per decode call (the paper: 1).
      input_len: encoder length in tokens (inputs zero-padded to it; longer ones cut, counted).
      target_len: max_decode_len in tokens.
    """

    task: str
    split: str = "test"
    num_examples: int = 100
    batch_size: int = 1
    input_len: int = 64
    target_len: int = 64

    def __post_init__(self):
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task (gin: TASK) must be a seqio task name; got {self.task!r}.")
        _check_int(self.num_examples, "num_examples", "NUM_EXAMPLES", 1)
        _check_int(self.batch_size, "batch_size", "BATCH_SIZE", 1)
        _check_int(self.input_len, "input_len", "INPUT_LEN", 1)
        _check_int(self.target_len, "target_len", "TARGET_LEN", 1)


@dataclasses.dataclass(frozen=True)
class SpeculationConfig:
    """How the speculative rows are run.

    Attributes:
      gamma: γ of the headline row: an int >= 1, or 'auto' (`auto_gamma.AutoGammaDecoder`: γ in
        0..auto_gamma_max chosen before each call from the measured cost curve and the running α;
        0 = the baseline alone). An auto headline with `gammas` None sweeps 1..auto_gamma_max
        too, so the best fixed γ in hindsight is in the same run; with `gammas` [] it runs alone
        beside the baseline.
      gammas: extra rows of the speedup-vs-γ sweep (ints >= 1; 'auto' adds an auto row).
      auto_gamma_max: largest γ auto considers.
      draft_name: label of the draft in tables.
      trees: extra rows with token trees, each its per-depth branching factors (e.g.
        [(2, 2), (3, 2, 1)]) or its nodes' child-rank paths (e.g. ((0,), (1,), (0, 0)));
        `tree.parse_tree`), verified in one target call per iteration.
      tree_rule: the trees' acceptance rule at T > 0 (`tree.TREE_RULES`).
    """

    gamma: int | str
    gammas: Sequence[int | str] | None = None
    auto_gamma_max: int = 6
    draft_name: str = "draft"
    trees: Sequence[Sequence] | None = None
    tree_rule: str = "without_replacement"

    def __post_init__(self):
        requested = [self.gamma, *(self.gammas or ())]
        bad = [
            g
            for g in requested
            if g != "auto" and (isinstance(g, bool) or not isinstance(g, int) or g < 1)
        ]
        if bad:
            raise ValueError(
                f"gamma and gammas (gin: GAMMA, GAMMAS) take ints >= 1 or 'auto'; got {bad}. "
                "The baseline runs in every eval anyway; 'auto' may also switch speculation off "
                "(γ 0)."
            )
        _check_int(self.auto_gamma_max, "auto_gamma_max", "AUTO_GAMMA_MAX", 1)
        from specdec_t5x import tree  # local: imports the network

        for shape in self.trees or ():
            try:
                tree.parse_tree(shape)
            except (TypeError, ValueError) as err:
                raise ValueError(f"TREES: bad tree {shape!r}: {err}") from None
        if self.tree_rule not in tree.TREE_RULES:
            raise ValueError(
                f"tree_rule (gin: TREE_RULE) must be one of {tree.TREE_RULES}; got "
                f"{self.tree_rule!r}."
            )

    @property
    def auto(self) -> bool:
        """Whether an auto-γ row runs (headline or sweep)."""
        return "auto" in [self.gamma, *(self.gammas or ())]

    @property
    def tree_rows(self) -> dict[str, tuple]:
        """{row name, e.g. 'tree(3,2,1)' or 'tree[0,1,00]': the tree (`tree.TreeShape.spec`)}."""
        from specdec_t5x import tree  # local: imports the network

        return {tree.tree_name(s): tree.parse_tree(s).spec for s in self.trees or ()}

    @property
    def fixed_gammas(self) -> list[int]:
        """The fixed γ rows, sorted; an auto headline with `gammas` None sweeps
        1..auto_gamma_max (`gammas` []: none)."""
        fixed = sorted({g for g in [self.gamma, *(self.gammas or ())] if g != "auto"})
        if self.gamma == "auto" and not fixed and self.gammas is None:
            fixed = list(range(1, self.auto_gamma_max + 1))
        return fixed


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
    """What the job measures beside the timed rows.

    Attributes:
      seed: sampling seed (example batch i uses `fold_in(PRNGKey(seed), i)` for every decoder);
        also seeds the interleaved call order.
      cost_repeats: repeats of the step-cost measurement (and of auto's cost curve).
      cost_seconds: seconds the step-cost measurement's timed rounds may take once it has timed
        10 (`clock.MIN_ROUNDS`); 0: all `cost_repeats` rounds, however long.
      loop_costs: True, with `diagnostics`: c and verify/step as the real decode loops pay them
        (`timing.loops.loop_costs` on the first batches' caches, after the timed calls).
        Otherwise: from the step timer's one probe
        (`timing.step_timer.step_costs`, one compile), which prices the verify call and the draft
        below what the decode loops pay.
      diagnostics: True: c and verify/step from the decode loops (with `loop_costs`). False
        (default): the job compiles the rows and one cost probe only.
    """

    seed: int = 0
    cost_repeats: int = 60
    loop_costs: bool = True
    diagnostics: bool = False
    cost_seconds: float = 30.0

    def __post_init__(self):
        _check_int(self.seed, "seed", "SEED", 0)
        _check_int(self.cost_repeats, "cost_repeats", "COST_REPEATS", 2)
        seconds = self.cost_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(
                f"cost_seconds (gin: COST_SECONDS) must be a number >= 0; got {self.cost_seconds!r}."
            )
        _check_bool(self.loop_costs, "loop_costs", "LOOP_COSTS")
        _check_bool(self.diagnostics, "diagnostics", "DIAGNOSTICS")


def as_dict(*configs) -> dict:
    """The configs' fields, merged into one JSON-ready dict (for records and fingerprints)."""
    out = {}
    for config in configs:
        for key, value in dataclasses.asdict(config).items():
            out[key] = list(value) if isinstance(value, tuple) else value
    return out
