"""Speculative sampling (Leviathan et al., 2022, Algorithm 1) as one jitted `lax.while_loop`.

Glossary (the paper's terms; p is always the target, q the draft):

* target, M_p: the large model whose output distribution is preserved exactly.
* draft, M_q: the cheap model (T5, n-gram or source-copy) that proposes tokens.
* p, q: the *adjusted* next-token distributions of target and draft (temperature, then top-k or
  top-p, applied identically to both; argmax mode = one-hot of the argmax) (§2.2).
* gamma (γ): draft tokens proposed per iteration; the target scores all γ + 1 prefixes in one call.
* n_accepted: leading draft tokens accepted in an iteration (0..γ); the iteration then emits
  n_accepted + 1 tokens (the last from the residual norm(max(0, p - q)) or, after γ acceptances,
  the "bonus" token from p). `verification='block'` decides n_accepted and the residual jointly
  over the block (Sun et al., ICLR 2025; `verification.block_accept`).
* beta (β): Σ_x min(p(x), q(x)), the acceptance probability of one position (Def. 3.1);
  alpha (α) = E[β] (Corollary 3.6).
* c: cost of one draft step relative to one target step (measured by the eval job).
* tree: a draft token tree (per-depth branching factors, e.g. (3, 2, 1), or child-rank paths of
  its nodes, `tree.TreeShape`); the target verifies every node in one call (`tree`;
  `speculative_sample(tree=...)`). A chain of γ is (1,) * γ.

Worked example of one iteration, γ = 3, 2 drafts accepted (buffer holds decoder inputs by absolute
position; position 0 is the start token 0; `length` n counts valid positions)::

  before: buffer = [0, a, b, _, _, _, _], n = 3 (outputs a, b); caches valid for positions 0..1
  draft:  feed b@2 -> d1 = x; feed x@3 -> d2 = y; feed y@4 -> d3 = z   (draft wrote slots 2..4)
  verify: target on [b, x, y, z] at positions 2..5 -> p_1..p_4        (target wrote slots 2..5)
  accept: x, y accepted, z rejected -> t ~ norm(max(0, p_3 - q_3)); n_accepted = 2
  after:  buffer = [0, a, b, x, y, t, _], n = 6; caches valid for positions 0..4. The stale slots
          (draft 4, target 5) are never read: the next calls start at position 5 and overwrite.

Code: `speculative_sample` checks its keywords into settings objects and runs `_iteration` (the
paper's steps, one helper each: `_draft`, `_score`, `_verify`, then `loop.emit` and `_count`) in a
`lax.while_loop`; the tree loop (`tree_decoding`) shares `loop` with it.

When all γ drafts are accepted the draft never consumed d_γ; the next iteration's first draft call
then feeds two tokens (d_γ, bonus) instead of one (`draft_behind`), so no extra draft call is made.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from specdec_t5x import loop, steps, tree_decoding
from specdec_t5x import sampling as sampling_lib  # `sampling` is the settings' name below
from specdec_t5x import verification as verify
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation

Array = jax.Array


@flax.struct.dataclass
class SpeculativeStats(loop.LoopStats):
    """Per-row statistics of a speculative decode (only iterations before a row ended count).

    `loop.LoopStats`' fields for a chain of γ drafts (a draft test: the acceptance test of one
    draft token, min(n_accepted + 1, γ) per iteration; accept_histogram int32 [batch, γ + 1];
    num_proposed: γ per iteration, fewer with early exit), then:

    Attributes:
      log_prob: float32 [batch] Σ log p(token) of the generated tokens under the target's adjusted
        distribution (temperature, top-k, top-p): T5X's `temperature_sample` score with
        `rescale_log_probs=True` (0 in argmax mode, as T5X's greedy scores).
    """

    log_prob: Array

    @classmethod
    def zeros(cls, batch: int, gamma: int) -> SpeculativeStats:
        """The statistics before the first iteration, for `batch` rows and γ = `gamma`."""
        return cls.start(batch, gamma, log_prob=jnp.zeros((batch,), jnp.float32))


def speculative_sample(
    inputs: Array,
    target_cache: Any,
    target_tokens_to_logits: steps.BlockStep,
    draft_cache: Any,
    draft_tokens_to_logits: steps.BlockStep,
    eos_id: int,
    *,
    gamma: int | None = None,
    decode_rng: Array | None = None,
    temperature: float = 1.0,
    topk: int = 0,
    topp: float = 0.0,
    max_decode_steps: int | None = None,
    verification: str = "token",
    draft_confidence_threshold: float = 0.0,
    tree: tuple[int, ...] | None = None,
    tree_rule: str = "without_replacement",
) -> tuple[Array, SpeculativeStats]:
    """Decodes with the target's exact output distribution, calling it once per γ + 1 tokens.

    Algorithm 1 of the paper, batched with per-row acceptance: each row accepts its own number of
    drafts and ends at its own EOS; the loop ends when every row has ended or is full. The
    keywords are T5X's (gin binds them as T5X's `temperature_sample`'s); they are checked into a
    `sampling.SamplingSettings` (temperature, topk, topp) and a `speculation.Speculation` (the
    others but decode_rng), which the loop (`_iteration`, or `tree_decoding.tree_iteration`'s body) takes.

    Args:
      inputs: int32 [batch, max_decode_len], T5X semantics: all zeros for plain decoding; a
        leading run of non-zero tokens after column 0 (the start slot) is a forced decoder prompt
        (prefilled into both caches). Tokens after the first zero are ignored.
      target_cache: cache pytree of the target closure.
      target_tokens_to_logits: target block step `(tokens int32 [batch, k], positions int32
        [batch], cache) -> (logits float32 [batch, k, vocab], cache)` (`steps.BlockStep`).
      draft_cache: cache pytree of the draft closure.
      draft_tokens_to_logits: draft block step with the same contract and vocabulary size.
      eos_id: end-of-sequence id.
      gamma: draft tokens per iteration (γ >= 1); with `tree`, None or the tree's depth.
      decode_rng: PRNG key (None: `PRNGKey(0)`); unused in argmax mode.
      temperature: static float (per-row arrays are refused); at or below
        `sampling.MIN_TEMPERATURE` is argmax mode (output tokens identical to greedy
        `decoding.temperature_sample` with the target alone).
      topk: top-k filter applied to both p and q (0 = off).
      topp: nucleus filter applied to both p and q (0 = off).
      max_decode_steps: optional limit on generated tokens per row (prompt excluded), as T5X: an
        int (checked to be in [0, max_decode_len]) or an int32 scalar array (may be traced; not
        checked).
      verification: 'token' (Algorithm 1, token by token) or 'block' (block verification, Sun et
        al., ICLR 2025: same drafts and target call, at least as many accepted drafts per
        iteration, same output distribution); see `verification`. Argmax mode is the same for both.
      draft_confidence_threshold: static early exit in [0, 1): a row stops drafting after the first
        draft whose distribution has max q below it (γ is then the maximum block length; the
        target scores only the longest row's block). 0 = off. Output distribution unchanged.
      tree: None (the chain of γ drafts above) or a draft token tree: per-depth branching
        factors, e.g. (3, 2, 1), or child-rank paths, e.g. ((0,), (1,), (0, 0)) (`tree.TreeShape`):
        `tree_decoding.tree_iteration` verifies every node in one target call (the
        target's distribution exactly; argmax mode: greedy's tokens). Needs `tree.TreeStep`s
        (`steps.make_block_step` builds them), token verification and no early exit.
      tree_rule: the tree's acceptance rule at T > 0, one of `tree.TREE_RULES` ('topk': the
        draft's top-k children as point masses; 'iid': SpecInfer; 'without_replacement' (default):
        recursive speculative decoding).

    Returns:
      decodes: int32 [batch, max_decode_len]: prompt, generated tokens, EOS, then zeros.
      stats: `SpeculativeStats` (with `tree`: `tree.TreeStats`, the same fields and per-depth and
        per-rank acceptance).

    Raises:
      ValueError: no γ and no tree, γ < 1, unknown verification, threshold outside [0, 1),
        temperature < 0 or not a static number, topk < 0, topp outside [0, 1], topk and topp
        both set, target and draft vocabularies of different size, eos_id outside
        the vocabulary, inputs not 2-D, or max_decode_steps outside [0, max_decode_len]; with
        `tree`: a bad shape or rule, γ other than None or the tree's depth, block verification,
        early exit, or steps without tree support.
    """
    speculation = Speculation(
        gamma=gamma,
        tree=tree,
        tree_rule=tree_rule,
        verification=verification,
        draft_confidence_threshold=draft_confidence_threshold,
        max_decode_steps=max_decode_steps,
    )
    if speculation.depth is None:
        raise ValueError(
            "speculative decoding needs gamma (draft tokens per iteration, an int >= 1) or a "
            "tree: pass decoder_params={'gamma': 5}, or bind speculative.speculative_sample.gamma "
            "in gin (the GAMMA macro of gin/t5x/speculative.gin for T5X's infer.py and eval.py; "
            "the eval job's GAMMA)."
        )
    if not isinstance(temperature, int | float):
        raise ValueError(
            f"temperature must be a static Python number; got {type(temperature)} (per-row "
            "temperature arrays are supported by decoding.temperature_sample only)."
        )
    settings = SamplingSettings(temperature, topk, topp)
    target = (target_tokens_to_logits, target_cache)
    draft = (draft_tokens_to_logits, draft_cache)
    if tree is not None:
        init, body = tree_decoding.tree_iteration(
            inputs, target_cache, target_tokens_to_logits, draft_cache, draft_tokens_to_logits,
            eos_id, sampling=settings, speculation=speculation, decode_rng=decode_rng,
        )  # fmt: skip
    else:
        batch, _ = loop.check(inputs, max_decode_steps, target, draft, eos_id)
        init, body = loop.start(
            _iteration, inputs, max_decode_steps, gamma, target, draft, eos_id, decode_rng,
            SpeculativeStats.zeros(batch, gamma), sampling=settings, speculation=speculation,
        )  # fmt: skip
    return loop.run(body, init, inputs.shape[1])


def _iteration(
    state: loop.LoopState,
    *,
    target_fn: steps.BlockStep,
    draft_fn: steps.BlockStep,
    eos_id: int,
    limit: Array,
    sampling: SamplingSettings,
    speculation: Speculation,
) -> loop.LoopState:
    """One iteration of Algorithm 1 for every row (rows already done keep their tokens, length
    and statistics).

    Args:
      state: `loop.LoopState` with `SpeculativeStats`.
      target_fn, draft_fn: the target's and draft's `steps.BlockStep`s.
      eos_id: end-of-sequence id.
      limit: int32 [batch] the rows' length limits (`loop.start`).
      sampling, speculation: the run's settings (every field of `speculation` resolved).

    Returns:
      The `loop.LoopState` after the iteration.
    """
    if sampling.greedy:  # no random numbers in argmax mode
        rng = draft_rng = verify_rng = state.rng
    else:
        rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    active = ~state.done
    # 1. M_q guesses d_1..d_γ autoregressively (q_1..q_γ; fewer per row with early exit).
    drafts, q, num_drafts, draft_cache = _draft(
        draft_fn, state, active, sampling, speculation, draft_rng
    )
    # 2. M_p scores all γ + 1 prefixes in one parallel call (p_1..p_{γ+1}).
    target_logits, target_cache = _score(target_fn, state, drafts, num_drafts, active, speculation)
    # 3. Accept/reject the drafts, and 4. sample the correction (or bonus) token t.
    verdict, p = _verify(drafts, q, target_logits, num_drafts, verify_rng, sampling, speculation)
    # 5. Emit d_1..d_{n_accepted}, t (cut at EOS and at the row's limit) and count.
    out = loop.emit(state, drafts, verdict.n_accepted, verdict.extra, eos_id, limit, active)
    return loop.LoopState(
        buffer=out.buffer,
        length=out.length,
        draft_behind=active & (verdict.n_accepted == num_drafts),
        done=state.done | out.ended,
        target_cache=target_cache,
        draft_cache=draft_cache,
        rng=rng,
        stats=_count(state.stats, verdict, num_drafts, out, p, active),
    )


def _draft(draft_fn, state, active, sampling: SamplingSettings, speculation: Speculation, rng):
    """Step 1: drafts int32 [batch, γ], q float32 [batch, γ, vocab] (None in argmax mode),
    num_drafts int32 [batch] and the draft cache (`_draft_block`)."""
    greedy, adjust = sampling.greedy, sampling.adjust_logits

    def propose(logits, uniform):
        if greedy:
            return sampling_lib.first_argmax(logits), None
        q = jax.nn.softmax(adjust(logits), axis=-1)
        return sampling_lib.inverse_cdf_sample(uniform, q), q

    logits0, dc = loop.draft_root_logits(draft_fn, state, active)
    return _draft_block(
        draft_fn, propose, logits0, dc, state.length, None if greedy else rng, active,
        speculation.gamma, speculation.draft_confidence_threshold,
    )  # fmt: skip


def _score(target_fn, state, drafts, num_drafts, active, speculation: Speculation):
    """Step 2: the target's logits float32 [batch, γ + 1, vocab] after last, d_1..d_γ (with early
    exit only the longest row's block is scored, one compiled call per block length chosen by
    `lax.switch`; the rest is padding) and the target cache."""
    gamma, n = speculation.gamma, state.length
    last = state.buffer[jnp.arange(n.shape[0]), n - 1]  # [b] fed at position n - 1
    block = jnp.concatenate([last[:, None], drafts], axis=1)  # [b, γ + 1]

    def verify_call(k):
        def call(tc):
            logits, tc = target_fn(block[:, : k + 1], n - 1, tc)
            return jnp.pad(logits, ((0, 0), (0, gamma - k), (0, 0))), tc  # -> [b, γ + 1, V]

        return call

    if speculation.draft_confidence_threshold > 0:
        longest = jnp.max(jnp.where(active, num_drafts, 1))
        calls = [verify_call(k) for k in range(1, gamma + 1)]
        return jax.lax.switch(longest - 1, calls, state.target_cache)
    return verify_call(gamma)(state.target_cache)


def _verify(drafts, q, target_logits, num_drafts, rng, sampling: SamplingSettings, speculation):
    """Steps 3 and 4: the `verification.Verdict` (n_accepted, the extra token t, β) and p float32
    [batch, γ + 1, vocab], the target's adjusted distributions (None in argmax mode)."""
    if sampling.greedy:
        return verify.greedy_accept(drafts, target_logits, num_drafts), None
    accept = verify.block_accept if speculation.verification == "block" else verify.token_accept
    p = jax.nn.softmax(sampling.adjust_logits(target_logits), axis=-1)  # [b, γ + 1, V]
    return accept(rng, drafts, q, p, num_drafts), p


def _count(s: SpeculativeStats, verdict, num_drafts, out: loop.Emitted, p, active):
    """Step 5's statistics of this iteration (zero for rows already done)."""
    n_accepted, num_new = verdict.n_accepted, out.num_new
    gamma = verdict.beta.shape[1]
    slots = jnp.arange(gamma + 1)
    if p is None:  # T5X's greedy score: the adjusted distribution is one-hot
        log_prob = jnp.zeros(num_new.shape, jnp.float32)
    else:
        log_p = jnp.log(jnp.take_along_axis(p, out.tokens[..., None], -1)[..., 0])  # [b, γ + 1]
        log_prob = jnp.sum(jnp.where(slots < num_new[:, None], log_p, 0.0), axis=1)
    tested = jnp.minimum(jnp.minimum(n_accepted + 1, num_drafts), num_new)
    accepted = jnp.minimum(n_accepted, num_new)
    beta = jnp.sum(jnp.where(slots[:gamma] < tested[:, None], verdict.beta, 0), 1)
    s = s.count(active, tested, accepted, beta, num_new, num_drafts)
    return s.replace(log_prob=s.log_prob + log_prob)


def _draft_block(draft_fn, propose, logits0, dc, n, rng, active, gamma, threshold):
    """Drafts d_1..d_γ from the first draft logits on; with early exit, per-row block lengths.

    Early exit (threshold > 0): a row stops after d_j when its draft confidence max_x q_j(x) (the
    temperature-1 softmax of the raw logits in argmax mode) is below `threshold`; the loop stops
    when every active row has stopped. The stop depends only on the row's prefix, so verification
    of the shorter block stays exact (`verification`, `num_drafts`).

    Args:
      draft_fn: draft `steps.BlockStep`.
      propose: (logits float32 [batch, vocab], uniform float32 [batch]) -> (token int32 [batch],
        q float32 [batch, vocab] or None in argmax mode).
      logits0: float32 [batch, vocab] draft logits after the last emitted token.
      dc: draft cache after that call.
      n: int32 [batch] row lengths (d_j is fed at position n - 1 + j).
      rng: PRNG key for the draft samples (one uniform per row and draft, drawn at once); None
        in argmax mode (`propose` then ignores its uniform).
      active: bool [batch] rows still decoding.
      gamma: static γ (the maximum with early exit).
      threshold: static confidence threshold (0 = off: always γ drafts, one `lax.scan`).

    Returns:
      drafts int32 [batch, γ] (entries beyond a row's count are padding), q float32 [batch, γ,
      vocab] (None in argmax mode), num_drafts int32 [batch] in [1, γ], the draft cache.
    """
    batch = logits0.shape[0]
    if rng is None:  # argmax mode
        keys = jnp.zeros((gamma, batch), jnp.float32)
    else:
        keys = jax.random.uniform(rng, (gamma, batch))  # keys[j]: uniforms of draft j + 1
    token, q0 = propose(logits0, keys[0])
    if threshold <= 0:

        def step(carry, j):
            token, dc = carry
            logits, dc = draft_fn(token[:, None], n - 1 + j, dc)
            token, q = propose(logits[:, 0], keys[j])
            return (token, dc), (token, q)

        # Unrolled (γ is static): less wall time per decode than a rolled scan on XLA:CPU
        # (embedded En→De, γ = 2..5, interleaved).
        (_, dc), (rest, rest_q) = jax.lax.scan(step, (token, dc), jnp.arange(1, gamma), unroll=True)
        drafts = jnp.concatenate([token[:, None], rest.T], axis=1)  # [b, γ]
        q = None if q0 is None else jnp.concatenate([q0[:, None], jnp.moveaxis(rest_q, 0, 1)], 1)
        return drafts, q, jnp.full((batch,), gamma, jnp.int32), dc

    confident = lambda logits: jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1) >= threshold
    drafts = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)
    q = None if q0 is None else jnp.zeros((batch, gamma) + q0.shape[1:]).at[:, 0].set(q0)
    conf_logits = logits0 if q0 is None else jnp.log(jnp.maximum(q0, 1e-30))
    init = (1, token, dc, drafts, q, jnp.ones((batch,), jnp.int32), active & confident(conf_logits))

    def cond(carry):
        j, *_, drafting = carry
        return (j < gamma) & jnp.any(drafting)

    def body(carry):
        j, token, dc, drafts, q, count, drafting = carry
        logits, dc = draft_fn(token[:, None], n - 1 + j, dc)
        token, q_j = propose(logits[:, 0], keys[j])
        drafts = drafts.at[:, j].set(token)
        if q is not None:
            q = q.at[:, j].set(q_j)
        count = jnp.where(drafting, j + 1, count)
        conf = logits[:, 0] if q_j is None else jnp.log(jnp.maximum(q_j, 1e-30))
        return j + 1, token, dc, drafts, q, count, drafting & confident(conf)

    _, _, dc, drafts, q, count, _ = jax.lax.while_loop(cond, body, init)
    return drafts, q, count, dc
