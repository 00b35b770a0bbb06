"""The batch cost model: Thm 3.8 at batch b > 1, with the batched call's cost and the idle rows.

`speculative_sample` decodes a batch in one loop with per-row acceptance; the loop (like T5X's
baseline loop) runs until its slowest row ends. The paper's Thm 3.8 is batch 1 with a verify call
costing one step (§3.4-3.5); this module extends it with T(b, k), the target's cached call on b
rows of k tokens, and the idle-row waste of both loops (`benchmarks/batch_sweep.py` measures it
against the eval job at batch 1-32, `results/batch/`).
"""

from __future__ import annotations

import numpy as np

from specdec_t5x import theory

# --- Batches (§3.4-3.5 and Thm 3.8 at batch b > 1) -------------------------------------------
#
# A decode call on b rows runs one loop until its *slowest* row ends (T5X's while loop stops when
# every row has its EOS; Algorithm 1 batched the same way), and every step it pays the batched
# call, T(b, k) for k tokens per row. The paper's Thm 3.8 sees neither: one row (b = 1), and a
# verify call that costs one step (T(γ + 1) = T(1), "enough parallel compute", §3.4). With
#
#   T(b, k)   ms: the target's cached decoder call on b rows of k tokens each;
#   d(b)      ms: the draft's one-token step on b rows, as the decode loop pays it;
#   L_r       tokens: row r's output length (EOS counted), r = 1..b;
#   N_r       the iterations row r alone needs (Section 3.1's i.i.d. acceptance; E[N_r] ≈ L_r / E,
#             E = (1 − α^{γ+1}) / (1 − α), Eq. 1),
#
# one batch costs the baseline max_r L_r · T(b, 1) (one target step per token of its longest row)
# and speculation E[max_r N_r] · (γ d(b) + T(b, γ + 1)), so
#
#   S(b) = max_r L_r · T(b, 1) / (E[max_r N_r] · (γ d(b) + T(b, γ + 1)))
#        = E / (γ c_b + v_b)  ·  W_base / W_spec,
#
# c_b = d(b) / T(b, 1), v_b = T(b, γ + 1) / T(b, 1) (Thm 3.8 with the measured cost curve at
# batch b: `measured_walltime_improvement`), W_base = max_r L_r / mean_r L_r (the baseline's idle-row
# waste) and W_spec = E[max_r N_r] / (mean_r L_r / E) (speculation's: loop iterations per batch over
# the mean row's in Eq. 1's units, so it also holds each row's cut last block). At b = 1, v = 1
# and long outputs, W = 1 and S is Thm 3.8. E[max_r N_r] is
# computed exactly under the i.i.d. model (`expected_iterations`: P(max ≤ n) = Π_r P(N_r ≤ n)), the
# rows independent, last block cut at the row's EOS.


def batch_waste(lengths, alpha: float, gamma: int) -> dict[str, float]:
    """The idle-row waste of batched decoding, from the rows' output lengths.

    Args:
      lengths: output lengths in tokens (EOS counted) of each decode call's rows: int
        [calls, rows], or a list of per-call int sequences (a ragged last call), or one 1-D call.
      alpha: acceptance rate α in [0, 1]; gamma: draft tokens per iteration, integer >= 1.

    Returns:
      {'baseline_iterations': mean over calls of max_r L_r (the baseline's loop steps per call),
       'baseline_row_iterations': mean over calls of mean_r L_r,
       'speculative_iterations': mean over calls of E[max_r N_r] (`expected_iterations`, exact under
       §3.1's i.i.d. model), 'speculative_row_iterations': mean over calls of mean_r E[N_r],
       'baseline_waste' = the first over the second (>= 1), 'speculative_waste' likewise (>= 1:
       idle rows alone), 'speculative_waste_eq1' = E[max_r N_r] / (mean_r L_r / Eq. 1) (idle rows
       and each row's cut last block: the W_spec of `batch_walltime_improvement`)}.
    """
    if len(lengths) and np.ndim(lengths[0]) == 0:  # one call's rows
        lengths = [lengths]
    calls = [np.asarray(call, dtype=np.int64).reshape(-1) for call in lengths]
    if not calls or any(call.size == 0 for call in calls):
        raise ValueError("lengths must hold at least one call of at least one row")
    spec_max = [float(theory.expected_iterations(call[None, :], alpha, gamma)[0]) for call in calls]
    spec_rows = [float(np.mean(theory.expected_iterations(call, alpha, gamma))) for call in calls]
    out = {
        "baseline_iterations": float(np.mean([call.max() for call in calls])),
        "baseline_row_iterations": float(np.mean([call.mean() for call in calls])),
        "speculative_iterations": float(np.mean(spec_max)),
        "speculative_row_iterations": float(np.mean(spec_rows)),
    }
    out["baseline_waste"] = out["baseline_iterations"] / out["baseline_row_iterations"]
    out["speculative_waste"] = out["speculative_iterations"] / out["speculative_row_iterations"]
    eq1_rows = out["baseline_row_iterations"] / float(
        theory.expected_tokens_per_iteration(alpha, gamma)
    )
    out["speculative_waste_eq1"] = out["speculative_iterations"] / eq1_rows
    return out


def batch_walltime_improvement(
    alpha: float,
    gamma: int,
    c_b: float,
    verify_cost_ratio_b: float = 1.0,
    baseline_waste: float = 1.0,
    speculative_waste: float = 1.0,
) -> float:
    """Expected speedup of a batch of b rows (Thm 3.8, §3.4-3.5, with T(b, k) and idle rows).

    S(b) = E(α, γ) / (γ c_b + v_b) · W_base / W_spec (the derivation above): the per-iteration
    cost model of `measured_walltime_improvement` at batch b, times the ratio of the two loops'
    idle-row waste. b = 1 with v_b = 1 and no waste (W = 1) is `walltime_improvement` (Thm 3.8).

    Args:
      alpha: acceptance rate α in [0, 1] (per drafted token, pooled over the batch's rows).
      gamma: draft tokens per iteration, integer >= 1.
      c_b: d(b) / T(b, 1): the draft's step over the target's one-token call at batch b, >= 0
        (unitless; both in ms per call on b rows).
      verify_cost_ratio_b: v_b = T(b, γ + 1) / T(b, 1), > 0 (unitless; 1 on an accelerator where
        T(b, k) is flat in b·k, about (γ + 1) on a CPU whose calls are bound by arithmetic).
      baseline_waste: W_base = baseline loop steps per call / the mean row's length, >= 1.
      speculative_waste: W_spec = speculative loop iterations per call / (the mean row's length /
        Eq. 1), > 0 (`batch_waste`'s 'speculative_waste_eq1'; >= 1 but for sampling noise).

    Returns:
      Predicted speedup (X, unitless; > 1 is faster): decreasing in W_spec, c_b and v_b.
    """
    for name, w in (("baseline_waste", baseline_waste), ("speculative_waste", speculative_waste)):
        if not (np.isfinite(w) and w > 0):
            raise ValueError(f"{name} must be > 0, got {w!r}")
    per_iteration = theory.measured_walltime_improvement(alpha, gamma, c_b, verify_cost_ratio_b)
    return float(per_iteration) * baseline_waste / speculative_waste


def batch_speedup_from_costs(
    lengths,
    alpha: float,
    gamma: int,
    target_ms: float,
    verify_ms: float,
    draft_ms: float,
) -> dict[str, float]:
    """S(b) from measured costs and the rows' output lengths: the batch cost model end to end.

    Args:
      lengths: int [calls, rows] output lengths in tokens (EOS counted), b = rows.
      alpha: α in [0, 1]; gamma: integer >= 1.
      target_ms: T(b, 1), ms per target call on b rows of one token.
      verify_ms: T(b, γ + 1), ms per target call on b rows of γ + 1 tokens.
      draft_ms: d(b), ms per draft step on b rows (as the decode loop pays it).

    Returns:
      `batch_waste`'s dict plus 'c_b', 'verify_cost_ratio_b', 'per_iteration' (Thm 3.8 at b, no
      waste), 'speedup' (X) and 'baseline_ms_per_call', 'speculative_ms_per_call' (predicted loop
      ms per decode call, excluding the encoder and set-up both loops share).
    """
    for name, v in (("target_ms", target_ms), ("verify_ms", verify_ms)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be > 0 ms, got {v!r}")
    draft_ms = theory._check_cost(draft_ms, "draft_ms")
    out = batch_waste(lengths, alpha, gamma)
    c_b, v_b = draft_ms / target_ms, verify_ms / target_ms
    out.update(c_b=c_b, verify_cost_ratio_b=v_b)
    out["per_iteration"] = float(theory.measured_walltime_improvement(alpha, gamma, c_b, v_b))
    out["baseline_ms_per_call"] = out["baseline_iterations"] * target_ms
    out["speculative_ms_per_call"] = out["speculative_iterations"] * (gamma * draft_ms + verify_ms)
    out["speedup"] = out["baseline_ms_per_call"] / out["speculative_ms_per_call"]
    return out
