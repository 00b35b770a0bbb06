"""The eval job's XLA compilations: a fixed-γ run without diagnostics compiles three programs."""

import contextlib

import jax
from conftest import tiny_spec_pair
from test_eval import configs

from specdec_t5x.eval import cli, job

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Whole jitted programs, as against the single primitives JAX compiles for eager array ops: the
# rows' decode calls (`jit(<lambda>)`: the baseline; `jit(predict)`: a speculative call) and the
# step timer's probe (`jit(run)`).
PROGRAMS = ("jit(<lambda>)", "jit(predict)", "jit(run)")


@contextlib.contextmanager
def compilations():
    """[(fun_name, seconds)] of every XLA compilation inside the block (JAX's own events)."""
    seen = []

    def listener(event, duration_s, **kwargs):
        if event == COMPILE_EVENT:
            seen.append((kwargs.get("fun_name", "?"), duration_s))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_a_fixed_gamma_run_compiles_baseline_speculative_and_one_cost_probe(data_dir, tmp_path):
    """GAMMAS=None, no diagnostics, no compilation cache: the baseline, the speculative loop at γ
    and the step timer's one probe (c and verify/step for the headline); the run's extra cost
    calls (4 decode loops) and the loops' own work come with DIAGNOSTICS only."""
    cli.use_compilation_cache(None)  # every program compiles here
    spec_model, params = tiny_spec_pair()  # its initialisation compiles outside the count
    kwargs = configs(gamma=2, temperature=0.0, num_examples=2, cost_repeats=2)
    with compilations() as seen:
        metrics = job.evaluate(spec_model, params, str(tmp_path / "out"), **kwargs)
    programs = sorted(name for name, _ in seen if name in PROGRAMS)
    assert programs == ["jit(<lambda>)", "jit(predict)", "jit(run)"], seen
    slow = [(name, round(seconds, 2)) for name, seconds in seen if seconds > 1.0]
    assert len(slow) <= 3, slow  # on a busy machine the programs may take over a second each
    costs = metrics["costs"]["step_costs"]
    assert "source" not in costs and "c" in costs and "verify_cost_ratio" in costs
