"""The paper's closed forms for speculative decoding (Leviathan, Kalman, Matias 2022, Section 3).

NumPy (and one SciPy filter); nothing here touches JAX. Vocabulary follows the paper:

* `alpha`: expected acceptance rate α = E[β] of one draft token, in [0, 1) (Def. 3.1, Cor. 3.6).
* `beta`: acceptance rate β = Σ_x min(p(x), q(x)) of one prefix, p = target, q = draft.
* `gamma`: number of draft tokens proposed per iteration, an integer >= 1.
* `c`: cost coefficient, walltime of one draft (M_q) run / walltime of one target (M_p) run, >= 0.
* `c_hat`: arithmetic operations per token of M_q / of M_p, >= 0.

Closed forms accept a float `alpha` (and return a float) or a NumPy array of `alpha` values (and
return an array of the same shape). `gamma` is always a single integer.

As a script it prints the optimal γ and the predicted speedups for one (α, c), and with `--plot_dir`
writes the walltime improvement against γ for several α:

    python -m specdec_t5x.theory --alpha 0.75 --c 0.02 --gamma 7 --plot_dir results/theory
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import typing
from collections.abc import Sequence

import numpy as np
import scipy.signal

ArrayLike = float | np.ndarray

PLOT_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)  # The α curves of the plot written by `write_speedup_plot`.
PLOT_MAX_GAMMA = 10  # The plot's γ axis runs 1..PLOT_MAX_GAMMA.


class Table1Row(typing.NamedTuple):
    """One row of the paper's Table 1 (c = ĉ = 0), factors as printed, to 2 decimals."""

    alpha: float
    gamma: int
    operations_factor: float  # Thm 3.11, the "ops" column (X).
    speed_factor: float  # Thm 3.8, the "speed" column (X).


PAPER_TABLE1: tuple[Table1Row, ...] = (
    Table1Row(0.6, 2, 1.53, 1.96),
    Table1Row(0.7, 3, 1.58, 2.53),
    Table1Row(0.8, 2, 1.23, 2.44),
    Table1Row(0.8, 5, 1.63, 3.69),
    Table1Row(0.9, 2, 1.11, 2.71),
    Table1Row(0.9, 10, 1.60, 6.86),
)


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    alpha_arr = np.asarray(alpha, dtype=np.float64)
    bad = alpha_arr[~((alpha_arr >= 0.0) & (alpha_arr < 1.0))]  # NaN counts as bad.
    if bad.size:
        shown = alpha if alpha_arr.ndim == 0 else bad.tolist()
        raise ValueError(f"alpha must be in [0, 1), got {shown!r}")
    return alpha_arr


def _check_gamma(gamma: int, name: str = "gamma") -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, int | np.integer) or gamma < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {gamma!r}")
    return int(gamma)


def _check_cost(value: float, name: str) -> float:
    if not (isinstance(value, int | float | np.number) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _output(value: np.ndarray) -> ArrayLike:
    return float(value) if value.ndim == 0 else value


def expected_tokens_per_iteration(alpha: ArrayLike, gamma: int) -> ArrayLike:
    """Expected tokens produced by one iteration of Algorithm 1 (Eq. 1, Section 3.3).

    (1 − α^(γ+1)) / (1 − α): the mean of a geometric variable capped at γ + 1, i.e. the accepted
    drafts plus the one token sampled by the target.

    Args:
      alpha: expected acceptance rate α in [0, 1); float or float array of any shape.
      gamma: number of draft tokens per iteration, integer >= 1.

    Returns:
      Tokens per iteration (target runs), in [1, γ + 1]; float, or float64 array shaped like alpha.

    Raises:
      ValueError: if alpha is outside [0, 1) or gamma is not an integer >= 1.
    """
    alpha_arr, gamma = _check_alpha(alpha), _check_gamma(gamma)
    return _output((1.0 - alpha_arr ** (gamma + 1)) / (1.0 - alpha_arr))


def walltime_improvement(alpha: ArrayLike, gamma: int, c: float) -> ArrayLike:
    """Expected walltime speedup over plain decoding with the target (Theorem 3.8).

    (1 − α^(γ+1)) / ((1 − α)(γc + 1)): one iteration costs γ draft runs and one target run,
    i.e. (γc + 1) target runs of walltime, and yields Eq. 1 tokens. Assumes long generations and
    enough parallel compute for the γ + 1 target evaluations to cost one run.

    Args:
      alpha: expected acceptance rate α in [0, 1); float or float array of any shape.
      gamma: number of draft tokens per iteration, integer >= 1.
      c: draft-to-target walltime ratio per run, >= 0 (unitless).

    Returns:
      Speedup factor (X, unitless; > 1 is faster); float, or float64 array shaped like alpha.

    Raises:
      ValueError: if alpha is outside [0, 1), gamma is not an integer >= 1, or c < 0.
    """
    c = _check_cost(c, "c")
    tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
    return _output(tokens / (gamma * c + 1.0))


def measured_walltime_improvement(
    alpha: ArrayLike,
    gamma: int,
    c: float,
    verify_cost_ratio: float = 1.0,
    sampling_overhead: float = 0.0,
) -> ArrayLike:
    """Theorem 3.8 generalised to a measured cost curve; γ = 0 is plain decoding (1.0).

    E(α, γ) / (γc + T(γ + 1)/T(1) + o(γ)): one iteration costs γ draft steps (c each, in target
    steps), one verify call on γ + 1 tokens (`verify_cost_ratio` = T(γ + 1)/T(1); the paper assumes
    1) and the per-iteration sampling work o(γ) (drafting samples and the acceptance test at
    T > 0, in target steps), and yields E(α, γ) = Eq. 1 tokens, whose limit at α = 1 is γ + 1.
    With `verify_cost_ratio` = 1 and no overhead it equals `walltime_improvement`.

    Args:
      alpha: acceptance rate α in [0, 1] (a measured α may be exactly 1); float or float array.
      gamma: draft tokens per iteration, integer >= 0 (0: no draft, the baseline itself: 1.0).
      c: draft-to-target walltime ratio per step, >= 0.
      verify_cost_ratio: T(γ + 1) / T(1), the target's γ + 1-token call in one-token steps, > 0.
      sampling_overhead: o(γ) in target steps per iteration, >= 0.

    Returns:
      Predicted speedup (X, unitless); float, or float64 array shaped like alpha.

    Raises:
      ValueError: alpha outside [0, 1], gamma not an integer >= 0, c or sampling_overhead
        negative or not finite, verify_cost_ratio not > 0.
    """
    alpha_arr = np.asarray(alpha, dtype=np.float64)
    if not np.all((alpha_arr >= 0.0) & (alpha_arr <= 1.0)):
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int | np.integer) or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0 (0 = plain decoding), got {gamma!r}")
    c, overhead = _check_cost(c, "c"), _check_cost(sampling_overhead, "sampling_overhead")
    verify = _check_cost(verify_cost_ratio, "verify_cost_ratio")
    if verify == 0.0:
        raise ValueError(f"verify_cost_ratio must be > 0, got {verify_cost_ratio!r}")
    if gamma == 0:
        return _output(np.ones_like(alpha_arr))
    below_one = np.minimum(alpha_arr, 1.0 - 1e-12)
    tokens = np.where(
        alpha_arr >= 1.0, gamma + 1.0, (1.0 - below_one ** (gamma + 1)) / (1.0 - below_one)
    )
    return _output(tokens / (gamma * c + verify + overhead))


def iterations_pmf(max_length: int, alpha: float, gamma: int) -> np.ndarray:
    """Distribution of the iterations Algorithm 1 needs for an output of L tokens, L ≤ max_length.

    Section 3.1's model: every iteration emits K tokens, K − 1 ~ Geometric(1 − α) capped at γ
    (P(K = k) = α^(k−1)(1 − α) for k ≤ γ, P(K = γ + 1) = α^γ: Eq. 1 is E[K]), independently. An
    output of L tokens (its EOS counted) ends in the iteration whose tokens reach L: the last
    iteration's surplus is cut (EOS accepted mid-block, or the length limit). Eq. 1 ignores that
    cut, so for short outputs L / E[K] undercounts the iterations; `expected_iterations` uses this.

    Args:
      max_length: the longest L needed, integer >= 0 (tokens).
      alpha: acceptance rate α in [0, 1] (1: every block is accepted whole).
      gamma: draft tokens per iteration, integer >= 1.

    Returns:
      float64 [max_length + 1, max_length + 1]: row L is P(N = n) for n = 0..max_length
      (N = 0 only for L = 0; N ≤ L since every iteration emits at least one token).

    Raises:
      ValueError: max_length not an integer >= 0, alpha outside [0, 1], gamma not an integer >= 1.
    """
    if (
        isinstance(max_length, bool)
        or not isinstance(max_length, int | np.integer)
        or max_length < 0
    ):
        raise ValueError(f"max_length must be an integer >= 0, got {max_length!r}")
    if not (isinstance(alpha, int | float | np.number) and 0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    gamma, alpha = _check_gamma(gamma), float(alpha)
    k = np.arange(1, gamma + 2)
    p_k = np.where(k <= gamma, alpha ** (k - 1) * (1.0 - alpha), alpha**gamma)  # P(K = k)
    size = int(max_length) + 1
    pmf = np.zeros((size, size))
    pmf[0, 0] = 1.0
    for length in range(1, size):
        rest = np.maximum(length - k, 0)  # tokens left after an iteration of K = k tokens
        # N(L) = 1 + N(L − K): the rows of the shorter lengths, shifted by one iteration.
        pmf[length, 1:] = p_k @ pmf[rest, :-1]
    return pmf


def expected_iterations(lengths, alpha: float, gamma: int) -> np.ndarray:
    """Expected target calls (iterations) of Algorithm 1 per decode call, at these output lengths.

    Theorem 3.8 divides the tokens by Eq. 1, which assumes outputs long enough that the last,
    truncated block does not matter. For short outputs (a ~10-token synopsis at γ = 5) it does:
    this is the same i.i.d. model of Section 3.1 with the last block cut (`iterations_pmf`). A call
    decoding several rows runs until its slowest row ends, so per call this is E[max over its rows
    of N(L_row)], the rows independent: Σ_n (1 − Π_rows P(N(L_row) ≤ n)).

    Args:
      lengths: output lengths in tokens (EOS counted), integers >= 0: int [calls] (one row per
        call) or int [calls, rows] (the rows of each call; pad a ragged call with 0).
      alpha: acceptance rate α in [0, 1].
      gamma: draft tokens per iteration, integer >= 1.

    Returns:
      float64 [calls]: expected iterations per call (for one row of L tokens: L when α = 0,
      ceil(L / (γ + 1)) when α = 1, and L / Eq. 1 + O(1) for large L).

    Raises:
      ValueError: lengths not integers >= 0 or not 1-D / 2-D; alpha or gamma as `iterations_pmf`.
    """
    arr = np.asarray(lengths)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            f"lengths must be integers, int [calls] or int [calls, rows]; got dtype {arr.dtype}, "
            f"shape {np.shape(lengths)}."
        )
    if arr.size and arr.min() < 0:
        raise ValueError(f"lengths must be >= 0 tokens; got {int(arr.min())}.")
    arr = arr.astype(np.int64)  # an empty list arrives as float64
    top = int(arr.max()) if arr.size else 0
    if arr.shape[1] == 1:  # one row per call: the mean obeys E[N(L)] = 1 + Σ_k P(k) E[N(L − k)]
        iterations_pmf(0, alpha, gamma)  # validates alpha and gamma
        gamma, alpha = int(gamma), float(alpha)
        k = np.arange(1, gamma + 2)
        p_k = np.where(k <= gamma, alpha ** (k - 1) * (1.0 - alpha), alpha**gamma)
        # That recursion is a linear recurrence driven by ones (E[N(m)] = 0 for m <= 0): an IIR
        # filter, run in C (the auto-γ controller evaluates it for every γ before every call).
        mean = np.concatenate([[0.0], scipy.signal.lfilter([1.0], [1.0, *(-p_k)], np.ones(top))])
        return mean[arr[:, 0]]
    cdf = np.cumsum(iterations_pmf(top, alpha, gamma), axis=1)  # [L, n]: P(N(L) <= n)
    all_done = np.prod(cdf[arr], axis=1)  # [calls, n]: P(max over rows <= n)
    return np.sum(1.0 - all_done, axis=1)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The integer γ in [1, max_gamma] that maximises `walltime_improvement` (Section 3.3, Fig. 3).

    Found by brute force, as the paper does numerically. Ties go to the smallest γ. With c = 0 and
    α > 0 the improvement grows without bound in γ, so the answer is max_gamma (or the first γ at
    which it stops growing in float64).

    Args:
      alpha: expected acceptance rate α in [0, 1), a single float.
      c: draft-to-target walltime ratio per run, >= 0.
      max_gamma: largest γ searched, integer >= 1.

    Returns:
      The optimal number of draft tokens per iteration, an int in [1, max_gamma].

    Raises:
      ValueError: if alpha is not a single value in [0, 1), c < 0, or max_gamma is not an int >= 1.
    """
    if np.ndim(alpha) != 0:
        raise ValueError(f"alpha must be a single value for optimal_gamma, got {alpha!r}")
    max_gamma = _check_gamma(max_gamma, "max_gamma")
    return max(range(1, max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c))


def operations_factor(alpha: ArrayLike, gamma: int, c_hat: float) -> ArrayLike:
    """Expected factor of increase in total arithmetic operations (Theorem 3.11).

    (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1)): per iteration the target evaluates γ + 1 positions and the
    draft γ, each draft op costing ĉ target ops, spread over Eq. 1 tokens.

    Args:
      alpha: expected acceptance rate α in [0, 1); float or float array of any shape.
      gamma: number of draft tokens per iteration, integer >= 1.
      c_hat: draft-to-target arithmetic operations per token, >= 0 (unitless).

    Returns:
      Operations factor (X, unitless; >= 1 means more work); float, or float64 array like alpha.

    Raises:
      ValueError: if alpha is outside [0, 1), gamma is not an integer >= 1, or c_hat < 0.
    """
    c_hat = _check_cost(c_hat, "c_hat")
    tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
    return _output((gamma * c_hat + gamma + 1.0) / tokens)


def corollary_3_9_bound(alpha: ArrayLike, c: float) -> ArrayLike:
    """Lower bound (1 + α) / (1 + c) on the speedup at the optimal γ (Corollary 3.9).

    It equals `walltime_improvement(alpha, 1, c)`, so the optimal γ always reaches it; the
    corollary's content is that it exceeds 1 exactly when α > c. Where α <= c the corollary promises
    no speedup, so this function refuses rather than returning a "bound" <= 1.

    Args:
      alpha: expected acceptance rate α in [0, 1); float or float array of any shape.
      c: draft-to-target walltime ratio per run, >= 0.

    Returns:
      The bound (X, unitless, > 1); float, or float64 array shaped like alpha.

    Raises:
      ValueError: if alpha is outside [0, 1), c < 0, or any alpha <= c (the corollary needs α > c).
    """
    alpha_arr, c = _check_alpha(alpha), _check_cost(c, "c")
    if np.any(alpha_arr <= c):
        shown = alpha if alpha_arr.ndim == 0 else alpha_arr[alpha_arr <= c].tolist()
        raise ValueError(f"Corollary 3.9 needs alpha > c, got alpha={shown!r} with c={c!r}")
    return _output((1.0 + alpha_arr) / (1.0 + c))


def _check_fraction(numerator: ArrayLike, denominator: ArrayLike, names: tuple[str, str]):
    num, den = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    if not np.all(den > 0):
        raise ValueError(f"{names[1]} must be > 0, got {denominator!r}")
    # A float sum of betas may overshoot its count by rounding; allow a relative 1e-9.
    if not np.all((num >= 0) & (num <= den * (1 + 1e-9))):
        raise ValueError(f"{names[0]} must be in [0, {names[1]}], got {numerator!r}")
    return num, den


def alpha_from_beta(beta_sum: ArrayLike, num_beta: ArrayLike) -> ArrayLike:
    """α = E[β] estimated as the mean of measured acceptance rates β (Corollary 3.6).

    Each β = Σ_x min(p(x), q(x)) is one prefix's acceptance probability (Section 3.1); this is the
    estimator behind the paper's Table 3 (β summed over tokens generated by the target).

    Args:
      beta_sum: sum of β values, in [0, num_beta]; float or array (broadcasts with num_beta).
      num_beta: number of β values summed, > 0; int or array.

    Returns:
      α in [0, 1]; float, or float64 array of the broadcast shape.

    Raises:
      ValueError: if any num_beta <= 0 or any beta_sum is outside [0, num_beta].
    """
    beta_sum, num_beta = _check_fraction(beta_sum, num_beta, ("beta_sum", "num_beta"))
    return _output(np.minimum(beta_sum / num_beta, 1.0))


def alpha_counted(num_accepted: ArrayLike, num_tested: ArrayLike) -> ArrayLike:
    """α estimated as the fraction of tested draft tokens that were accepted (Section 3.1).

    Count only tokens that reached the accept test of Algorithm 1: per iteration n_accepted plus one
    if a draft was rejected, not γ. Under the i.i.d. assumption of Section 3.1 this is the maximum
    likelihood estimate of α; dividing by γ per iteration instead would bias it low.

    Args:
      num_accepted: accepted draft tokens, in [0, num_tested]; int or array (broadcasts).
      num_tested: draft tokens that went through the accept test, > 0; int or array.

    Returns:
      α in [0, 1]; float, or float64 array of the broadcast shape.

    Raises:
      ValueError: if any num_tested <= 0 or any num_accepted is outside [0, num_tested].
    """
    accepted, tested = _check_fraction(num_accepted, num_tested, ("num_accepted", "num_tested"))
    return _output(accepted / tested)


def summarize(
    alpha: float,
    c: float,
    gamma: int | None = None,
    c_hat: float | None = None,
    max_gamma: int = 64,
) -> dict[str, float | int]:
    """All closed forms for one (α, c): at the optimal γ and, if given, at `gamma`.

    Args:
      alpha: expected acceptance rate α in [0, 1).
      c: draft-to-target walltime ratio per run, >= 0.
      gamma: an extra γ to evaluate (integer >= 1), or None.
      c_hat: draft-to-target operations per token, >= 0; None means c_hat = c.
      max_gamma: largest γ searched for the optimum, integer >= 1.

    Returns:
      Flat dict: inputs, `optimal_gamma`, and `tokens_per_iteration`, `walltime_improvement`,
      `operations_factor` suffixed `@optimal_gamma` (and `@gamma`), plus `corollary_3_9_bound`
      when α > c.

    Raises:
      ValueError: on any invalid input, as the closed forms do.
    """
    c_hat = c if c_hat is None else c_hat
    best = optimal_gamma(alpha, c, max_gamma)
    summary: dict[str, float | int] = {"alpha": alpha, "c": c, "c_hat": c_hat}
    summary.update(max_gamma=max_gamma, optimal_gamma=best)
    for label, g in (("optimal_gamma", best), ("gamma", gamma)):
        if g is None:
            continue
        summary[label] = g
        summary[f"tokens_per_iteration@{label}"] = expected_tokens_per_iteration(alpha, g)
        summary[f"walltime_improvement@{label}"] = walltime_improvement(alpha, g, c)
        summary[f"operations_factor@{label}"] = operations_factor(alpha, g, c_hat)
    if alpha > c:
        summary["corollary_3_9_bound"] = corollary_3_9_bound(alpha, c)
    return summary


def write_speedup_plot(plot_dir: str, c: float, alphas: Sequence[float] = PLOT_ALPHAS) -> None:
    """Writes the walltime improvement against γ = 1..10 for several α (in the style of Fig. 3).

    Files: `speedup_vs_gamma.png` (one curve per α, the optimal γ within the range marked) and
    `speedup_vs_gamma.csv` (columns alpha, gamma, c, walltime_improvement, tokens_per_iteration).

    Args:
      plot_dir: output directory, created if missing.
      c: draft-to-target walltime ratio per run, >= 0.
      alphas: the α values to plot, each in [0, 1).

    Raises:
      ValueError: if c < 0 or any alpha is outside [0, 1).
    """
    from matplotlib import figure
    from matplotlib.backends import backend_agg

    gammas = list(range(1, PLOT_MAX_GAMMA + 1))
    os.makedirs(plot_dir, exist_ok=True)
    fig = figure.Figure(figsize=(6, 4.5), dpi=120)
    backend_agg.FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    rows = []
    for alpha in alphas:
        speedups = [walltime_improvement(alpha, g, c) for g in gammas]
        rows += [
            (alpha, g, c, s, expected_tokens_per_iteration(alpha, g))
            for g, s in zip(gammas, speedups, strict=True)
        ]
        (line,) = ax.plot(gammas, speedups, marker=".", label=f"α = {alpha:g}")
        best = optimal_gamma(alpha, c, PLOT_MAX_GAMMA)
        ax.plot(best, speedups[best - 1], marker="*", markersize=12, color=line.get_color())
    ax.set(xlabel="γ (draft tokens per iteration)", ylabel="expected walltime improvement (X)")
    ax.set_title(f"Thm 3.8 at c = {c:g} (★ = best γ ≤ {PLOT_MAX_GAMMA})")
    ax.set_xticks(gammas)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(plot_dir, "speedup_vs_gamma.png"))
    with open(os.path.join(plot_dir, "speedup_vs_gamma.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["alpha", "gamma", "c", "walltime_improvement", "tokens_per_iteration"])
        writer.writerows([a, g, c_, f"{s:.6f}", f"{t:.6f}"] for a, g, c_, s, t in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: prints `summarize` as `key: value` lines; `--plot_dir` also writes the plot and JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, required=True, help="acceptance rate α in [0, 1)")
    parser.add_argument("--c", type=float, required=True, help="draft/target walltime ratio")
    parser.add_argument("--gamma", type=int, default=None, help="also evaluate at this γ")
    parser.add_argument("--c_hat", type=float, default=None, help="draft/target ops (default: c)")
    parser.add_argument("--max_gamma", type=int, default=64, help="largest γ searched")
    parser.add_argument("--plot_dir", default=None, help="write plot, CSV and summary.json here")
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.alpha, args.c, args.gamma, args.c_hat, args.max_gamma)
        if args.plot_dir:
            write_speedup_plot(args.plot_dir, args.c)
    except ValueError as e:
        parser.error(str(e))
    for key, value in summary.items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    if args.plot_dir:
        with open(os.path.join(args.plot_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"wrote {args.plot_dir}/speedup_vs_gamma.png, .csv and summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
