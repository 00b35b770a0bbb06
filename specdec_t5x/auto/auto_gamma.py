"""`gamma='auto'`: speculative decoding with γ chosen before every call, 0 = plain decoding.

`AutoGammaDecoder` measures the cost curve on the first batch (`cost_curve.measure_cost_curve`;
kept across runs by `cost_cache`), calibrates it with real calls of every γ, keeps one jitted
decoder per γ and asks a `gamma_controller.GammaController` for γ before every call (γ is static
under `jit`). A `speculation_gate.SpeculationGate` between the choice and the call starts the run
on the baseline and speculates only while the run's own timed calls show that it pays.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from specdec_t5x import models, steps
from specdec_t5x.auto import cost_cache as cost_cache_lib
from specdec_t5x.auto import gamma_controller, speculation_gate
from specdec_t5x.timing import cost_curve

Array = jax.Array
logger = logging.getLogger(__name__)

# A run of at most this many calls is short: its curve is measured with `SHORT_RUN_REPEATS`
# repeats and no calibration rounds (4 rounds of 7 plans are 28 calls, several times the run).
SHORT_RUN_CALLS = 10
SHORT_RUN_REPEATS = 3
# With the run's length known, calibration rounds fit in this share of its expected decode time.
CALIBRATION_SHARE = 0.1
# Gate reasons of a γ = 0 call that times the baseline (a measurement call: no prediction).
_GATE_TIMING = ("gate_baseline", "gate_refresh")
# The controller's choices its model makes alone; with a gate its best γ runs instead.
_GATED_MODEL = ("off", "explore")
DEFAULT_GATE: speculation_gate.GateConfig | None = speculation_gate.GateConfig()


def call_counts(decodes, aux: Mapping[str, Any] | None = None) -> tuple[int, int | None]:
    """(longest row's generated tokens, counted iterations or None) of one decode call: `decodes`
    int32 [batch, max_decode_len] (0 = padding after EOS), `aux['stats']` the iterations."""
    longest = int(np.max(np.count_nonzero(np.asarray(decodes), axis=-1), initial=0))
    stats = (aux or {}).get("stats")
    iterations = None if stats is None else int(np.max(np.asarray(stats.num_iterations)))
    return max(longest, 1), iterations


class AutoGammaDecoder:
    """`gamma='auto'`: speculative decoding with γ chosen per call, 0 = the baseline alone.

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`; target_params, draft_params (default:
        `spec_model.draft.params`); settings: {'temperature', 'topk', 'topp'}.
      gamma_max: largest γ (>= 1); verification, draft_confidence_threshold: the chains'
        (`speculative.speculative_sample`); prior_alpha: α before the first call (None: probe
        with γ = 1); cost_repeats: the cost curve's timing rounds.
      calibration_rounds: rounds of real calls of every plan on the first batch calibrating the
        curve (`cost_curve.calibrated`); 0 (default): none, the run's own timed calls correct
        the curve (experiments/auto_calibration); curve: a `CostCurve` to use as given.
      config: `gamma_controller.GammaConfig` (None: defaults); baseline_sampler: γ = 0's draw.
      clock: wall-clock seconds (None: `time.perf_counter`; tests inject one).
      gate: `speculation_gate.GateConfig` (True: `DEFAULT_GATE`; None or False: no gate).
      cost_cache: `cost_cache.open_cache`'s setting (None: the environment's or the default).
      expected_calls: the run's calls if known: at most `SHORT_RUN_CALLS` measures a quick curve
        without calibration rounds; longer runs bound the rounds to `calibration_share` (None:
        `CALIBRATION_SHARE`) of their expected decode time.

    Raises:
      ValueError: gamma_max < 1 or calibration_rounds < 0 (or not ints).

    A plan is γ (0 = off). Use `decoder(batch, rng)`, or, to keep compilation out of a timed
    region, `choose`, `compile`, then the timed `decode`, `update` and `observe`.
    `calibration` says where the curve came from ('source'), its seconds and rounds.
    """

    def __init__(self, spec_model, target_params, draft_params=None, *,
                 settings: Mapping[str, Any], gamma_max: int = 8, verification: str = "token",
                 draft_confidence_threshold: float = 0.0, prior_alpha: float | None = None,
                 cost_repeats: int = 20, calibration_rounds: int = 0,
                 curve: cost_curve.CostCurve | None = None,
                 config: gamma_controller.GammaConfig | None = None,
                 baseline_sampler: str = "t5x", clock: Callable[[], float] | None = None,
                 gate: speculation_gate.GateConfig | bool | None = True, cost_cache: Any = None,
                 expected_calls: int | None = None, calibration_share: float | None = None):  # fmt: skip
        if not isinstance(gamma_max, int) or gamma_max < 1:
            raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
        if not isinstance(calibration_rounds, int) or calibration_rounds < 0:
            raise ValueError(f"calibration_rounds must be an int >= 0; got {calibration_rounds!r}.")
        self.clock = clock
        self.calibration_rounds = calibration_rounds
        self.config = gamma_controller.GammaConfig() if config is None else config
        self.spec_model, self.target_params = spec_model, target_params
        self.draft_params = spec_model.draft.params if draft_params is None else draft_params
        self.settings = dict(settings)
        self.gamma_max, self.verification = gamma_max, verification
        self.threshold, self.prior_alpha = draft_confidence_threshold, prior_alpha
        self.cost_repeats = cost_repeats
        if gate is True:
            gate = DEFAULT_GATE
        self.gate_config, self.gate = (gate or None), None
        self.cache = cost_cache_lib.open_cache(cost_cache) if curve is None else None
        self.expected_calls, self.calibration_share = expected_calls, calibration_share
        self.calibration = {}  # what the curve's set-up did: source, seconds, rounds, key
        if curve is not None:
            curve = dataclasses.replace(curve, source="given")
        self.controller = None if curve is None else self._controller(curve)
        self._fns: dict[Any, Any] = {}
        self._compiled: set[tuple] = set()
        self.baseline_sampler = baseline_sampler
        self._baseline = models.EncoderDecoderModel(
            spec_model.module,
            cpu_weight_dtype=getattr(spec_model, "cpu_weight_dtype", "float32"),
            sampler=baseline_sampler,
        )

    def _controller(self, curve: cost_curve.CostCurve) -> gamma_controller.GammaController:
        controller = gamma_controller.GammaController(curve, self.prior_alpha, self.config)
        if self.gate_config is not None:
            self.gate = speculation_gate.SpeculationGate(curve.baseline_call_ms, self.gate_config)
        return controller

    def _now(self) -> float:
        return time.perf_counter() if self.clock is None else self.clock()

    @property
    def plans(self) -> list[int]:
        """The candidate plans: γ = 0..gamma_max."""
        return list(range(self.gamma_max + 1))

    def _fn(self, gamma):
        if gamma not in self._fns:
            if gamma == 0:  # the draft's parameters stay out of it
                params = dict(self.settings)
                fn = jax.jit(
                    lambda tp, b, rng: (
                        self._baseline.predict_batch_with_aux(tp, b, rng, decoder_params=params)[0],
                        {},
                    )
                )
                self._fns[0] = lambda tp, dp, b, rng: fn(tp, b, rng)
                return self._fns[0]
            extra = {"gamma": gamma, "verification": self.verification,
                     "draft_confidence_threshold": self.threshold}  # fmt: skip
            params = {**self.settings, **extra}
            self._fns[gamma] = jax.jit(
                lambda tp, dp, b, rng: self.spec_model.predict_batch_with_aux(
                    tp, b, rng, decoder_params=params, draft_params=dp
                )
            )
        return self._fns[gamma]

    @property
    def short_run(self) -> bool:
        """Whether the run is known to make at most `SHORT_RUN_CALLS` calls."""
        return self.expected_calls is not None and self.expected_calls <= SHORT_RUN_CALLS

    def _repeats(self) -> int:
        return min(self.cost_repeats, SHORT_RUN_REPEATS) if self.short_run else self.cost_repeats

    def _rounds(self) -> int:
        """Calibration rounds: none in a short run."""
        return 0 if self.short_run else self.calibration_rounds

    def _measurement(self) -> dict[str, Any]:
        """How the curve is measured: part of its cache key (`cost_cache.curve_key`)."""
        return {
            "gamma_max": self.gamma_max,
            "settings": sorted((k, str(v)) for k, v in self.settings.items()),
            "verification": self.verification,
            "draft_confidence_threshold": self.threshold,
            "baseline_sampler": self.baseline_sampler,
            "cost_repeats": self._repeats(),
            "calibration_rounds": self._rounds(),
        }

    def choose(self, batch: Mapping[str, Array]) -> tuple[int, float | None]:
        """(plan, predicted speedup) for the next call, as the gate lets it run (0 with the
        gate's reason in `controller.last_choice` otherwise); sets the curve up on the first
        batch. With a gate, where the controller's model alone would stay off or explore, its
        best γ is the plan ('gated_best'): the gate's measured calls decide whether it runs."""
        if self.controller is None:
            self._setup(batch)
        c = self.controller
        plan, predicted = c.choose()
        if self.gate is None:
            return plan, predicted
        if c.last_choice["reason"] in _GATED_MODEL and c.best:
            # Whether speculation pays is the gate's call, from the run's own calls; the model
            # only says which γ: its best, not its break-even 'off' or an optimistic exploration.
            plan, predicted = c.best
            c.exploring = False
            c.last_choice = {**c.last_choice, "reason": "gated_best", "predicted": predicted}
        run, reason = self.gate.choose(plan)
        if run == plan:
            if reason is not None:  # an exploration: the controller's plan, marked
                c.last_choice = {**c.last_choice, "gate": reason}
            return plan, predicted
        c.exploring = False  # not the exploration the controller chose
        predicted = None if reason in _GATE_TIMING else 1.0
        c.last_choice = {
            "reason": reason,
            "alpha": c.alpha,
            "predicted": predicted,
            "wanted": str(plan),
        }
        return 0, predicted

    def _setup(self, batch: Mapping[str, Array]) -> None:
        """The curve (cached, or measured, calibrated and cached), the controller, and the
        calibration calls' timings fed to it; logs its progress every 30 s."""
        start = self._now()
        enc = batch["encoder_input_tokens"]
        max_len = batch["decoder_input_tokens"].shape[1]
        key = curve = None
        if self.cache is not None:
            pair = (self.spec_model, self.target_params, self.draft_params)
            key = cost_cache_lib.curve_key(*pair, enc.shape, max_len, self._measurement())
            curve = self.cache.load(key)
        calls: dict[Any, list] = {}
        with cost_cache_lib.Heartbeat("auto γ: cost curve and calibration") as beat:
            self._beat = beat
            if curve is not None:
                curve = dataclasses.replace(curve, source="cache")
                logger.info("auto γ: cost curve read from the cache (%s)", self.cache.path(key))
            else:
                curve = cost_curve.measure_cost_curve(
                    self.spec_model, self.target_params, self.draft_params, enc, max_len,
                    self.gamma_max, self.settings, self.verification, self._repeats(),
                    baseline_sampler=self.baseline_sampler,
                    progress=lambda stage: setattr(beat, "stage", f"cost curve: {stage}"),
                )  # fmt: skip
                calls = self._calibration_calls(batch) if self._rounds() else {}
                # A γ may have no call left when the budget stopped the rounds.
                chains = {g: v for g, v in calls.items() if v}
                if chains:
                    curve = cost_curve.calibrated(curve, chains)
                if curve.source != "measured":
                    curve = dataclasses.replace(curve, source="measured")
                if self.cache is not None:
                    self.cache.store(key, curve, self._now() - start)
        self._beat = None
        self.calibration = {
            "source": curve.source,
            "seconds": self._now() - start,
            "rounds": min((len(v) for v in calls.values()), default=0),
            "cost_repeats": None if curve.source == "cache" else self._repeats(),
            "cache_file": None if key is None else str(self.cache.path(key)),
        }
        logger.info(
            "auto γ: cost curve %s, %d calibration rounds, %.1f s",
            {"cache": "from the cache"}.get(curve.source, curve.source),
            self.calibration["rounds"],
            self.calibration["seconds"],
        )
        self.controller = self._controller(curve)
        # The calibration's calls time the baseline (ρ_b) and each γ (ρ_s) at the same moment.
        for seconds, longest, _ in calls.get(0, []):
            self.controller.time_baseline(seconds, longest)
        for gamma in sorted(g for g in calls if g > 0):
            for seconds, longest, iterations in calls[gamma]:
                self.controller.time_speculative(gamma, seconds, longest, iterations)

    def _calibration_calls(self, batch: Mapping[str, Array]) -> dict[Any, list]:
        """{plan: [(seconds, longest tokens, iterations)]}: up to `calibration_rounds` rounds of
        every plan on `batch` after a discarded warm-up round, each in a seeded random order;
        with `expected_calls` known, a round starts only while the rounds so far plus one more
        fit in `calibration_share` of the run's expected decode time."""
        plans = self.plans
        beat = getattr(self, "_beat", None)
        for plan in plans:
            if beat is not None:
                beat.stage = f"compiling {plan}"
            self.compile(plan, batch)
        calls: dict[Any, list] = {p: [] for p in plans}
        order = np.random.default_rng(0)
        rounds = self._rounds()
        budget = last = None
        spent = 0.0
        # Round -1 is a discarded warm-up: the first calls after compiling run well above their
        # later time while the executables take turns.
        for r in range(-1, rounds):
            if r >= 0 and budget is not None and spent + last > budget:
                logger.info(
                    "auto γ: calibration stopped after %d of %d rounds (budget %.1f s)", r, rounds,
                    budget,
                )  # fmt: skip
                break
            if beat is not None:
                beat.stage = "calibration warm-up round" if r < 0 else f"calibration round {r + 1}"
            rng = jax.random.PRNGKey(max(r, 0))
            round_start = self._now()
            for i in order.permutation(len(plans)):
                plan = plans[int(i)]
                start = self._now()
                decodes, aux = jax.block_until_ready(self.decode(plan, batch, rng))
                seconds = self._now() - start
                if r >= 0:
                    calls[plan].append((seconds, *call_counts(decodes, aux)))
                elif plan == 0 and self.expected_calls is not None:
                    share = self.calibration_share
                    share = CALIBRATION_SHARE if share is None else share
                    budget = share * self.expected_calls * seconds
            last = self._now() - round_start
            spent += last if r >= 0 else 0.0
        return calls

    def compile(self, gamma, batch: Mapping[str, Array]) -> None:
        """Compiles and runs once a plan's decoder for this batch shape (once per encoder length
        bucket: `steps.warmup_sources`), if not done yet."""
        key = (gamma, *(tuple(v.shape) for v in batch.values()))
        if key not in self._compiled:
            rng = jax.random.PRNGKey(0)
            enc = batch["encoder_input_tokens"]
            for warm in steps.warmup_sources(self.target_params, enc):
                jax.block_until_ready(
                    self._fn(gamma)(
                        self.target_params,
                        self.draft_params,
                        {**batch, "encoder_input_tokens": warm},
                        rng,
                    )
                )
            self._compiled.add(key)

    def decode(self, gamma, batch: Mapping[str, Array], rng: Array):
        """(decodes int32 [batch, max_decode_len], aux) with γ (0: the baseline, aux = {})."""
        return self._fn(gamma)(self.target_params, self.draft_params, batch, rng)

    def update(self, aux: Mapping[str, Any]) -> None:
        """Feeds a chain call's β into the running α (no-op for γ = 0)."""
        if "stats" in aux:
            self.controller.update(aux["stats"])

    def observe(
        self, gamma, seconds: float, decodes: Array, aux: Mapping[str, Any] | None = None
    ) -> None:
        """Feeds a timed call of γ to the controller and the gate: wall seconds, its int32
        [batch, len] decodes (padding rows included) and aux."""
        longest, iterations = call_counts(decodes, aux)
        self.controller.observe(gamma, seconds, longest, iterations)
        if self.gate is not None:
            self.gate.observe(gamma, seconds, longest)

    def __call__(self, batch: Mapping[str, Array], rng: Array):
        """Chooses γ, decodes, learns α and the timing; returns (decodes, aux + γ as 'gamma',
        prediction)."""
        gamma, predicted = self.choose(batch)
        self.compile(gamma, batch)
        start = self._now()
        decodes, aux = jax.block_until_ready(self.decode(gamma, batch, rng))
        seconds = self._now() - start
        self.update(aux)
        self.observe(gamma, seconds, decodes, aux)
        return decodes, {**aux, "gamma": gamma, "predicted_speedup": predicted}
