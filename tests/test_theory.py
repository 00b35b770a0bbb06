"""Tests for specdec_t5x.theory: the paper's closed forms, Table 1, validation and the CLI."""

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from specdec_t5x import batch_theory, theory

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("row", theory.PAPER_TABLE1, ids=lambda r: f"a{r.alpha}_g{r.gamma}")
def test_table1_rows_to_two_decimals(row):
    # Table 1 uses c = c_hat = 0; the paper prints both factors rounded to 2 decimals.
    assert round(theory.operations_factor(row.alpha, row.gamma, 0.0), 2) == row.operations_factor
    assert round(theory.walltime_improvement(row.alpha, row.gamma, 0.0), 2) == row.speed_factor


def test_table1_has_the_papers_six_rows():
    assert [(r.alpha, r.gamma) for r in theory.PAPER_TABLE1] == [
        (0.6, 2),
        (0.7, 3),
        (0.8, 2),
        (0.8, 5),
        (0.9, 2),
        (0.9, 10),
    ]


# Table 4 "expected" column: Thm 3.8 at Table 2's (alpha, gamma) and Table 4's c. The paper rounds
# alpha and c to 2 decimals, so two rows land 0.07 away from the printed 1-decimal value.
TABLE4_EXPECTED = [
    (0.75, 7, 0.02, 3.2),
    (0.80, 7, 0.04, 3.3),
    (0.82, 7, 0.11, 2.5),
    (0.62, 7, 0.02, 2.3),
    (0.68, 5, 0.04, 2.4),
    (0.71, 3, 0.11, 2.0),
    (0.65, 5, 0.02, 2.4),
    (0.73, 5, 0.04, 2.6),
    (0.74, 3, 0.11, 2.0),
    (0.53, 5, 0.02, 1.9),
    (0.55, 3, 0.04, 1.8),
    (0.56, 3, 0.11, 1.6),
]


@pytest.mark.parametrize("alpha,gamma,c,expected", TABLE4_EXPECTED)
def test_table4_expected_speedups_within_rounding(alpha, gamma, c, expected):
    assert abs(theory.walltime_improvement(alpha, gamma, c) - expected) < 0.1


def test_bigram_text_example():
    # Section 4.1 text: bigram draft, alpha ~ 0.2, c = 0, gamma = 3 -> 1.25X.
    assert round(theory.walltime_improvement(0.2, 3, 0.0), 2) == 1.25


def test_closed_forms_known_values_and_edges():
    assert theory.expected_tokens_per_iteration(0.0, 5) == 1.0
    assert theory.expected_tokens_per_iteration(0.5, 1) == pytest.approx(1.5)
    assert theory.expected_tokens_per_iteration(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    # gamma = 1 gives exactly the Corollary 3.9 bound.
    assert theory.walltime_improvement(0.7, 1, 0.1) == pytest.approx(1.7 / 1.1)
    assert theory.operations_factor(0.0, 4, 0.5) == pytest.approx(4 * 0.5 + 4 + 1)
    assert isinstance(theory.walltime_improvement(0.5, 2, 0.1), float)


def test_closed_forms_vectorise_over_alpha():
    alphas = np.array([[0.0, 0.3], [0.6, 0.95]])
    out = theory.walltime_improvement(alphas, 4, 0.05)
    assert out.shape == (2, 2)
    expected = [[theory.walltime_improvement(float(a), 4, 0.05) for a in r] for r in alphas]
    np.testing.assert_allclose(out, expected)


def _brute_force_gamma(alpha, c, max_gamma):
    values = [(1 - alpha ** (g + 1)) / ((1 - alpha) * (g * c + 1)) for g in range(1, max_gamma + 1)]
    return values.index(max(values)) + 1, max(values)


@pytest.mark.parametrize("c", [0.0, 0.01, 0.02, 0.05, 0.11, 0.3, 1.0])
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.3, 0.5, 0.62, 0.75, 0.8, 0.9, 0.97])
def test_optimal_gamma_matches_brute_force(alpha, c):
    best = theory.optimal_gamma(alpha, c, max_gamma=64)
    brute_gamma, brute_value = _brute_force_gamma(alpha, c, 64)
    assert theory.walltime_improvement(alpha, best, c) == pytest.approx(brute_value, rel=1e-12)
    if c > 0:  # With c = 0 the curve saturates in float64 and ties are a matter of the last bit.
        assert best == brute_gamma


def test_optimal_gamma_known_values():
    assert theory.optimal_gamma(0.75, 0.02) == 9
    assert theory.optimal_gamma(0.0, 0.0) == 1  # All gammas tie at 1X; smallest wins.
    assert theory.optimal_gamma(0.5, 0.6) == 1  # alpha < c: nothing beats gamma = 1.
    assert theory.optimal_gamma(0.9, 0.0, max_gamma=10) == 10
    assert isinstance(theory.optimal_gamma(0.6, 0.05), int)


@pytest.mark.parametrize("c", [0.0, 0.02, 0.05, 0.1, 0.3])
def test_corollary_3_9_bound_holds_at_optimal_gamma(c):
    for alpha in np.linspace(0.0, 0.99, 34):
        if alpha <= c:
            continue
        bound = theory.corollary_3_9_bound(float(alpha), c)
        best = theory.optimal_gamma(float(alpha), c)
        assert bound > 1.0
        assert theory.walltime_improvement(float(alpha), best, c) >= bound - 1e-12


def test_corollary_3_9_rejects_alpha_not_above_c():
    with pytest.raises(ValueError, match=r"alpha > c.*alpha=0\.1 with c=0\.2"):
        theory.corollary_3_9_bound(0.1, 0.2)
    with pytest.raises(ValueError, match=r"alpha=0\.2 with c=0\.2"):
        theory.corollary_3_9_bound(0.2, 0.2)


@pytest.mark.parametrize("alpha", [1.0, -0.1, 1.5, float("nan")])
def test_rejects_alpha_outside_unit_interval(alpha):
    pattern = rf"alpha must be in \[0, 1\), got {re.escape(repr(alpha))}"
    for call in (
        lambda: theory.expected_tokens_per_iteration(alpha, 2),
        lambda: theory.walltime_improvement(alpha, 2, 0.0),
        lambda: theory.operations_factor(alpha, 2, 0.0),
        lambda: theory.optimal_gamma(alpha, 0.0),
        lambda: theory.corollary_3_9_bound(alpha, 0.0),
    ):
        with pytest.raises(ValueError, match=pattern):
            call()


def test_rejects_bad_alpha_inside_array_naming_it():
    with pytest.raises(ValueError, match=r"got \[1\.2\]"):
        theory.walltime_improvement(np.array([0.5, 1.2]), 2, 0.0)


@pytest.mark.parametrize("gamma", [0, -3, 2.0, 2.5, True, "3", None])
def test_rejects_gamma_not_positive_int(gamma):
    pattern = rf"gamma must be an integer >= 1, got {re.escape(repr(gamma))}"
    with pytest.raises(ValueError, match=pattern):
        theory.walltime_improvement(0.5, gamma, 0.0)
    with pytest.raises(ValueError, match=pattern):
        theory.operations_factor(0.5, gamma, 0.0)
    with pytest.raises(ValueError, match=rf"max_{pattern}"):
        theory.optimal_gamma(0.5, 0.0, max_gamma=gamma)


def test_accepts_numpy_integer_gamma():
    assert theory.walltime_improvement(0.5, np.int64(3), 0.0) == pytest.approx(1.875)


@pytest.mark.parametrize("bad", [-0.01, float("inf"), float("nan")])
def test_rejects_negative_or_nonfinite_costs(bad):
    shown = re.escape(repr(bad))
    with pytest.raises(ValueError, match=rf"c must be a finite number >= 0, got {shown}"):
        theory.walltime_improvement(0.5, 2, bad)
    with pytest.raises(ValueError, match=rf"c_hat must be a finite number >= 0, got {shown}"):
        theory.operations_factor(0.5, 2, bad)
    with pytest.raises(ValueError, match=rf"c must be a finite number >= 0, got {shown}"):
        theory.optimal_gamma(0.5, bad)


def test_alpha_from_beta_and_counted():
    assert theory.alpha_from_beta(7.5, 10) == pytest.approx(0.75)
    assert theory.alpha_counted(3, 4) == pytest.approx(0.75)
    np.testing.assert_allclose(
        theory.alpha_from_beta(np.array([1.0, 2.0]), np.array([4, 2])), [0.25, 1.0]
    )
    np.testing.assert_allclose(theory.alpha_counted(np.array([0, 5]), 10), [0.0, 0.5])
    # A float sum of betas that overshoots its count by rounding is clipped, not rejected.
    assert theory.alpha_from_beta(10 * (1 + 1e-12), 10) == 1.0


def test_alpha_helpers_validate():
    with pytest.raises(ValueError, match=r"num_beta must be > 0, got 0"):
        theory.alpha_from_beta(0.0, 0)
    with pytest.raises(ValueError, match=r"beta_sum must be in \[0, num_beta\], got 11"):
        theory.alpha_from_beta(11, 10)
    with pytest.raises(ValueError, match=r"num_tested must be > 0, got -1"):
        theory.alpha_counted(0, -1)
    with pytest.raises(ValueError, match=r"num_accepted must be in \[0, num_tested\], got -2"):
        theory.alpha_counted(-2, 5)


def test_summarize_defaults_c_hat_to_c():
    summary = theory.summarize(0.75, 0.02, gamma=7)
    assert summary["optimal_gamma"] == 9 and summary["gamma"] == 7 and summary["c_hat"] == 0.02
    assert summary["operations_factor@gamma"] == theory.operations_factor(0.75, 7, 0.02)
    assert summary["corollary_3_9_bound"] == pytest.approx(1.75 / 1.02)
    assert "corollary_3_9_bound" not in theory.summarize(0.1, 0.2)


def _run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "specdec_t5x.theory", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_optimum_and_writes_plot(tmp_path):
    out_dir = tmp_path / "theory"
    proc = _run_cli("--alpha", "0.75", "--c", "0.02", "--gamma", "7", "--plot_dir", str(out_dir))
    assert proc.returncode == 0, proc.stderr
    best = theory.optimal_gamma(0.75, 0.02)
    assert f"optimal_gamma: {best}\n" in proc.stdout
    speedup = theory.walltime_improvement(0.75, best, 0.02)
    assert f"walltime_improvement@optimal_gamma: {speedup:.4f}" in proc.stdout
    assert "walltime_improvement@gamma: 3.1" in proc.stdout  # 3.157X at gamma = 7.
    png = out_dir / "speedup_vs_gamma.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out_dir / "speedup_vs_gamma.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(theory.PLOT_ALPHAS) * theory.PLOT_MAX_GAMMA
    row = next(r for r in rows if r["alpha"] == "0.9" and r["gamma"] == "10")
    assert float(row["walltime_improvement"]) == pytest.approx(
        theory.walltime_improvement(0.9, 10, 0.02), abs=1e-6
    )
    assert json.loads((out_dir / "summary.json").read_text())["optimal_gamma"] == best


def test_cli_rejects_bad_alpha():
    proc = _run_cli("--alpha", "1.0", "--c", "0.0")
    assert proc.returncode == 2
    assert "alpha must be in [0, 1), got 1.0" in proc.stderr


def test_measured_walltime_improvement_generalises_theorem_3_8():
    for alpha, gamma, c in [(0.6, 2, 0.1), (0.9, 7, 0.02), (0.0, 1, 0.5)]:
        assert theory.measured_walltime_improvement(alpha, gamma, c) == pytest.approx(
            theory.walltime_improvement(alpha, gamma, c)
        )
    # γ = 0 is plain decoding; α = 1 gives γ + 1 tokens per iteration.
    assert theory.measured_walltime_improvement(0.7, 0, 0.3) == 1.0
    assert theory.measured_walltime_improvement(1.0, 3, 0.1, 1.5, 0.2) == pytest.approx(4 / 2.0)
    # Verify cost and overhead add to the denominator.
    e = theory.expected_tokens_per_iteration(0.8, 4)
    got = theory.measured_walltime_improvement(0.8, 4, 0.05, 1.3, 0.1)
    assert got == pytest.approx(e / (4 * 0.05 + 1.3 + 0.1))
    np.testing.assert_allclose(
        theory.measured_walltime_improvement(np.array([0.5, 1.0]), 2, 0.0), [1.75, 3.0]
    )
    for kwargs, match in [
        (dict(alpha=1.1, gamma=1, c=0.1), "alpha"),
        (dict(alpha=0.5, gamma=-1, c=0.1), "gamma"),
        (dict(alpha=0.5, gamma=1, c=0.1, verify_cost_ratio=0.0), "verify_cost_ratio"),
        (dict(alpha=0.5, gamma=1, c=0.1, sampling_overhead=-1.0), "sampling_overhead"),
    ]:
        with pytest.raises(ValueError, match=match):
            theory.measured_walltime_improvement(**kwargs)


# ------------------------------------------------------------------------------------------------
# Iterations at finite output lengths (the last block cut at EOS).


def _simulate_iterations(lengths, alpha, gamma, trials, rng):
    """Monte Carlo of Section 3.1's model: per iteration 1 + (accepted drafts, each an independent
    Bernoulli(α) test, stopping at the first rejection or at γ) tokens; a row needs iterations
    until its tokens reach its length; a call lasts as long as its slowest row."""
    total = 0
    for _ in range(trials):
        slowest = 0
        for length in lengths:
            left, iterations = length, 0
            while left > 0:
                tokens = 1
                while tokens <= gamma and rng.random() < alpha:
                    tokens += 1
                left -= tokens
                iterations += 1
            slowest = max(slowest, iterations)
        total += slowest
    return total / trials


@pytest.mark.parametrize(
    "lengths,alpha,gamma", [([11], 0.52, 5), ([9, 4, 13], 0.55, 3), ([1, 30], 0.8, 7)]
)
def test_expected_iterations_matches_a_simulation_of_the_model(lengths, alpha, gamma):
    rng = np.random.default_rng(0)
    trials = 4000
    simulated = _simulate_iterations(lengths, alpha, gamma, trials, rng)
    expected = theory.expected_iterations([lengths], alpha, gamma)[0]
    # N <= max(lengths): the standard error is below max(lengths) / (2 sqrt(trials)).
    assert abs(simulated - expected) < 4 * max(lengths) / (2 * np.sqrt(trials))


def test_expected_iterations_limits():
    # α = 0: one token per iteration; α = 1: whole blocks of γ + 1, the last one cut.
    assert theory.expected_iterations([7, 0, 1], 0.0, 5).tolist() == [7.0, 0.0, 1.0]
    assert theory.expected_iterations([7, 13, 4], 1.0, 3).tolist() == [2.0, 4.0, 1.0]
    assert theory.expected_iterations([], 0.5, 3).shape == (0,)  # no calls
    # Long outputs: L / Eq. 1 up to O(1) (the last block), i.e. Theorem 3.8's count.
    long = theory.expected_iterations([2000], 0.6, 4)[0]
    assert long == pytest.approx(2000 / theory.expected_tokens_per_iteration(0.6, 4), abs=2.0)
    # Short outputs need more iterations than Eq. 1 counts (11 tokens, α 0.52, γ 5: ~9 % more).
    short = theory.expected_iterations([11], 0.52, 5)[0]
    assert short > 1.08 * 11 / theory.expected_tokens_per_iteration(0.52, 5)
    # A call of two rows lasts at least as long as each row alone, less than both in sequence.
    one, other = theory.expected_iterations([9, 14], 0.6, 4)
    both = theory.expected_iterations([[9, 14]], 0.6, 4)[0]
    assert max(one, other) < both < one + other


def test_iterations_pmf_rows_are_distributions():
    pmf = theory.iterations_pmf(20, 0.65, 4)
    assert pmf.shape == (21, 21)
    np.testing.assert_allclose(pmf.sum(axis=1), 1.0, atol=1e-12)
    assert pmf[0, 0] == 1.0 and pmf[1, 1] == 1.0  # one token: one iteration
    # L tokens need between ceil(L / (γ + 1)) and L iterations.
    for length in range(1, 21):
        support = np.nonzero(pmf[length] > 0)[0]
        assert support.min() == -(-length // 5) and support.max() == length


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: theory.expected_iterations([3, -1], 0.5, 2), "lengths must be >= 0"),
        (lambda: theory.expected_iterations([3.0, 2.0], 0.5, 2), "lengths must be integers"),
        (lambda: theory.expected_iterations(np.zeros((2, 2, 2), int), 0.5, 2), "int \\[calls"),
        (lambda: theory.expected_iterations([3], 1.5, 2), "alpha must be a number in \\[0, 1\\]"),
        (lambda: theory.expected_iterations([3], 0.5, 0), "gamma must be an integer >= 1"),
        (lambda: theory.iterations_pmf(-1, 0.5, 2), "max_length must be an integer >= 0"),
    ],
)
def test_expected_iterations_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- The batch cost model ------------------------------------------------------------------


def test_batch_model_at_batch_one_is_theorem_3_8():
    for alpha, gamma, c in ((0.6, 2, 0.0), (0.8, 5, 0.05), (0.9, 10, 0.01)):
        assert batch_theory.batch_walltime_improvement(alpha, gamma, c) == pytest.approx(
            theory.walltime_improvement(alpha, gamma, c)
        )
    # From costs: one long row, a flat cost curve (T(1, γ + 1) = T(1, 1)): Thm 3.8 to O(1/L).
    out = batch_theory.batch_speedup_from_costs([[5000]], 0.8, 3, 2.0, 2.0, 0.1)
    assert out["baseline_waste"] == 1.0 and out["speculative_waste"] == 1.0
    assert out["speedup"] == pytest.approx(theory.walltime_improvement(0.8, 3, 0.05), rel=1e-3)


def test_batch_model_is_monotone_in_the_waste():
    speeds = [
        batch_theory.batch_walltime_improvement(0.7, 3, 0.05, 1.2, 1.0, w)
        for w in (1.0, 1.2, 1.5, 2.0)
    ]
    assert all(np.diff(speeds) < 0)
    base = [
        batch_theory.batch_walltime_improvement(0.7, 3, 0.05, 1.2, w, 1.0) for w in (1.0, 1.5, 2.0)
    ]
    assert all(np.diff(base) > 0)
    # More uneven rows in one call: more idle iterations for both loops.
    even = batch_theory.batch_waste([[20, 20, 20, 20]], 0.7, 3)
    uneven = batch_theory.batch_waste([[5, 10, 25, 40]], 0.7, 3)
    assert even["baseline_waste"] == 1.0 and uneven["baseline_waste"] == 2.0
    assert 1.0 < even["speculative_waste"] < uneven["speculative_waste"]


def test_batch_model_hand_computed_case():
    # α = 0.5, γ = 1: an iteration emits K = 1 or 2 tokens with probability 1/2 each.
    # One row of L = 2: N = 1 (K = 2) or 2 (K = 1, then >= 1): E[N] = 1.5, P(N <= 1) = 1/2.
    # Two such rows: P(max <= 1) = 1/4, so E[max] = 1 + 3/4 = 1.75; baseline: 2 steps.
    waste = batch_theory.batch_waste([[2, 2]], 0.5, 1)
    assert waste["speculative_iterations"] == pytest.approx(1.75)
    assert waste["speculative_row_iterations"] == pytest.approx(1.5)
    assert waste["speculative_waste"] == pytest.approx(1.75 / 1.5)
    assert waste["baseline_iterations"] == 2.0 and waste["baseline_waste"] == 1.0
    # T(2, 1) = 1 ms, T(2, 2) = 1.5 ms, d(2) = 0.25 ms: spec 1.75 * (0.25 + 1.5) ms, base 2 * 1 ms.
    out = batch_theory.batch_speedup_from_costs([[2, 2]], 0.5, 1, 1.0, 1.5, 0.25)
    assert out["speedup"] == pytest.approx(2.0 / (1.75 * 1.75))
    assert out["c_b"] == 0.25 and out["verify_cost_ratio_b"] == 1.5
    # The closed form with Eq. 1's W_spec gives the same number: E = 1.5, W_spec = 1.75 / (2 / 1.5).
    closed = batch_theory.batch_walltime_improvement(
        0.5, 1, 0.25, 1.5, 1.0, waste["speculative_waste_eq1"]
    )
    assert closed == pytest.approx(out["speedup"])


def test_batch_waste_takes_a_ragged_last_call():
    out = batch_theory.batch_waste([[4, 8], [6]], 0.0, 2)  # α = 0: one token per iteration
    assert out["speculative_iterations"] == pytest.approx(7.0)  # (8 + 6) / 2
    assert out["baseline_row_iterations"] == pytest.approx(6.0)  # (6 + 6) / 2
    with pytest.raises(ValueError):
        batch_theory.batch_waste([], 0.5, 1)
    with pytest.raises(ValueError):
        batch_theory.batch_walltime_improvement(0.5, 1, 0.1, 1.0, 1.0, 0.0)
