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

When all γ drafts are accepted the draft never consumed d_γ; the next iteration's first draft call
then feeds two tokens (d_γ, bonus) instead of one (`draft_behind`), so no extra draft call is made.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import sampling, steps
from specdec_t5x import tree as tree_lib  # `tree` is speculative_sample's argument
from specdec_t5x import verification as verify

Array = jax.Array


@flax.struct.dataclass
class SpeculativeStats:
    """Per-row statistics of a speculative decode (only iterations before a row ended count).

    Attributes:
      num_iterations: int32 [batch] target verify calls (iterations).
      num_draft_tokens: int32 [batch] draft tokens whose acceptance test ran:
        min(n_accepted + 1, γ) per iteration (fewer when EOS or the length limit cut the block).
      num_accepted: int32 [batch] accepted draft tokens (α_counted = num_accepted /
        num_draft_tokens; each test is a Bernoulli(β) trial, Def. 3.1).
      accept_histogram: int32 [batch, gamma + 1] iterations that accepted n drafts.
      beta_sum: float32 [batch] Σ β over tested positions (Corollary 3.6 estimator of α).
      num_beta: int32 [batch] number of β terms in `beta_sum`.
      num_generated: int32 [batch] tokens written by the loop (forced prompt excluded, EOS
        included); tokens per iteration = num_generated / num_iterations.
      num_proposed: int32 [batch] draft tokens proposed (γ per iteration; fewer with early exit).
      log_prob: float32 [batch] Σ log p(token) of the generated tokens under the target's adjusted
        distribution (temperature, top-k, top-p): T5X's `temperature_sample` score with
        `rescale_log_probs=True` (0 in argmax mode, as T5X's greedy scores).
    """

    num_iterations: Array
    num_draft_tokens: Array
    num_accepted: Array
    accept_histogram: Array
    beta_sum: Array
    num_beta: Array
    num_generated: Array
    num_proposed: Array
    log_prob: Array


@flax.struct.dataclass
class _LoopState:
    """Carry of the speculative loop.

    Attributes:
      buffer: int32 [batch, max_decode_len + gamma + 2] decoder inputs by absolute position.
      length: int32 [batch] valid positions in `buffer` (start token included).
      draft_behind: bool [batch] the draft cache lacks the entry at position length - 2.
      done: bool [batch] row ended (EOS) or reached its length limit.
      target_cache, draft_cache: the closures' caches.
      rng: PRNG key.
      stats: `SpeculativeStats`.
    """

    buffer: Array
    length: Array
    draft_behind: Array
    done: Array
    target_cache: Any
    draft_cache: Any
    rng: Array
    stats: SpeculativeStats


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
    drafts and ends at its own EOS; the loop ends when every row has ended or is full.

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
        `tree_decoding.tree_sample` verifies every node in one target call (the
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
      ValueError: γ < 1, unknown verification, threshold outside [0, 1), temperature < 0 or not a static number, topk < 0, topp outside [0, 1],
        topk and topp both set, target and draft vocabularies of different size, eos_id outside
        the vocabulary, inputs not 2-D, or max_decode_steps outside [0, max_decode_len]; with
        `tree`: a bad shape or rule, γ other than None or the tree's depth, block verification,
        early exit, or steps without tree support.
    """
    if tree is not None:
        return _tree_sample(
            inputs,
            target_cache,
            target_tokens_to_logits,
            draft_cache,
            draft_tokens_to_logits,
            eos_id,
            gamma=gamma,
            decode_rng=decode_rng,
            temperature=temperature,
            topk=topk,
            topp=topp,
            max_decode_steps=max_decode_steps,
            verification=verification,
            draft_confidence_threshold=draft_confidence_threshold,
            tree=tree,
            tree_rule=tree_rule,
        )
    if gamma is None:
        raise ValueError(
            "speculative decoding needs gamma (draft tokens per iteration, an int >= 1) or a "
            "tree: pass decoder_params={'gamma': 5}, or bind speculative.speculative_sample.gamma "
            "in gin (the GAMMA macro of gin/t5x/speculative.gin for T5X's infer.py and eval.py; "
            "the eval job's GAMMA)."
        )
    if not isinstance(gamma, int) or gamma < 1:
        hint = (
            " (γ = 'auto' is chosen outside jit: gamma_control.AutoGammaDecoder, or the eval job)"
            if gamma == "auto"
            else ""
        )
        raise ValueError(f"gamma must be an int >= 1; got gamma={gamma!r}{hint}.")
    if verification not in verify.VERIFICATIONS:
        raise ValueError(
            f"verification must be one of {verify.VERIFICATIONS}; got verification={verification!r}."
        )
    accept_fn = verify.block_accept if verification == "block" else verify.token_accept
    threshold = draft_confidence_threshold
    if not isinstance(threshold, int | float) or not 0.0 <= threshold < 1.0:
        raise ValueError(
            "draft_confidence_threshold must be a static number in [0, 1) (0 = off); got "
            f"draft_confidence_threshold={threshold!r}."
        )
    if not isinstance(temperature, int | float):
        raise ValueError(
            f"temperature must be a static Python number; got {type(temperature)} (per-row "
            "temperature arrays are supported by decoding.temperature_sample only)."
        )
    sampling.validate(temperature, topk, topp)
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be int32 [batch, max_decode_len]; got shape {inputs.shape}.")
    batch, max_len = inputs.shape
    concrete = isinstance(max_decode_steps, int | np.integer)  # else a (traced) int32 scalar
    if concrete and not 0 <= int(max_decode_steps) <= max_len:
        raise ValueError(
            f"max_decode_steps must be in [0, max_decode_len={max_len}]; got {max_decode_steps}."
        )
    steps.check_vocab(
        target_tokens_to_logits, target_cache, draft_tokens_to_logits, draft_cache, batch, eos_id
    )
    greedy = sampling.is_greedy(temperature)
    if decode_rng is None:
        decode_rng = jax.random.PRNGKey(0)

    buffer, length, limit, target_cache, draft_cache = steps.start_loop(
        inputs, max_decode_steps, gamma, (target_tokens_to_logits, target_cache),
        (draft_tokens_to_logits, draft_cache),
    )  # fmt: skip
    init = _LoopState(
        buffer=buffer,
        length=length,
        draft_behind=jnp.zeros((batch,), bool),
        done=length - 1 >= limit,
        target_cache=target_cache,
        draft_cache=draft_cache,
        rng=decode_rng,
        stats=SpeculativeStats(
            num_iterations=jnp.zeros((batch,), jnp.int32),
            num_draft_tokens=jnp.zeros((batch,), jnp.int32),
            num_accepted=jnp.zeros((batch,), jnp.int32),
            accept_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
            beta_sum=jnp.zeros((batch,), jnp.float32),
            num_beta=jnp.zeros((batch,), jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32),
            num_proposed=jnp.zeros((batch,), jnp.int32),
            log_prob=jnp.zeros((batch,), jnp.float32),
        ),
    )
    adjust = lambda logits: sampling.adjust_logits(logits, temperature, topk, topp)

    def body(state: _LoopState) -> _LoopState:
        if greedy:  # no random numbers in argmax mode
            rng = draft_rng = verify_rng = state.rng
        else:
            rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
        n, active = state.length, ~state.done
        rows = jnp.arange(batch)
        last = state.buffer[rows, n - 1]  # [b] last token, fed at position n - 1

        # 1. Draft up to γ tokens autoregressively (q_1..q_γ, d_1..d_γ; `_draft_block`).
        def propose(logits, uniform):
            if greedy:
                return sampling.first_argmax(logits), None
            q = jax.nn.softmax(adjust(logits), axis=-1)
            return sampling.inverse_cdf_sample(uniform, q), q

        def first_draft_call(dc):
            def one_token(dc):
                logits, dc = draft_tokens_to_logits(last[:, None], n - 1, dc)
                return logits[:, 0], dc

            def two_tokens(dc):
                # Rows behind feed (d_γ, bonus) at n-2, n-1; others (last, last) at n-1, n and
                # use column 0 (their slot n is overwritten before it is ever read).
                behind = state.draft_behind
                prev = state.buffer[rows, jnp.maximum(n - 2, 0)]
                tokens = jnp.stack([jnp.where(behind, prev, last), last], axis=1)  # [b, 2]
                logits, dc = draft_tokens_to_logits(tokens, n - 1 - behind, dc)
                return jnp.where(behind[:, None], logits[:, 1], logits[:, 0]), dc

            return jax.lax.cond(jnp.any(state.draft_behind & active), two_tokens, one_token, dc)

        logits0, dc = first_draft_call(state.draft_cache)
        drafts, q, num_drafts, dc = _draft_block(
            draft_tokens_to_logits,
            propose,
            logits0,
            dc,
            n,
            None if greedy else draft_rng,
            active,
            gamma,
            threshold,
        )

        # 2. One target call scores all γ + 1 prefixes (p_1..p_{γ+1}); with early exit it scores
        # only the longest row's block (one compiled call per block length, chosen by lax.switch).
        block = jnp.concatenate([last[:, None], drafts], axis=1)  # [b, γ + 1]

        def verify_call(k):
            def call(tc):
                logits, tc = target_tokens_to_logits(block[:, : k + 1], n - 1, tc)
                return jnp.pad(logits, ((0, 0), (0, gamma - k), (0, 0))), tc  # -> [b, γ + 1, V]

            return call

        if threshold > 0:
            longest = jnp.max(jnp.where(active, num_drafts, 1))
            calls = [verify_call(k) for k in range(1, gamma + 1)]
            target_logits, tc = jax.lax.switch(longest - 1, calls, state.target_cache)
        else:
            target_logits, tc = verify_call(gamma)(state.target_cache)

        # 3. Accept/reject (`verification`): n_accepted and the extra token t.
        if greedy:
            verdict = verify.greedy_accept(drafts, target_logits, num_drafts)
        else:
            p = jax.nn.softmax(adjust(target_logits), axis=-1)  # [b, γ + 1, V]
            verdict = accept_fn(verify_rng, drafts, q, p, num_drafts)
            p_token = lambda tokens: jnp.take_along_axis(p, tokens[..., None], -1)[..., 0]
        n_accepted, extra, beta = verdict

        # 4. Emit d_1..d_{n_accepted}, t; cut at EOS and at the row's length limit.
        slots = jnp.arange(gamma + 1)
        new_tokens = jnp.pad(drafts, ((0, 0), (0, 1)))
        new_tokens = jnp.where(slots == n_accepted[:, None], extra[:, None], new_tokens)
        is_eos = (new_tokens == eos_id) & (slots <= n_accepted[:, None])
        first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), gamma + 1)
        num_new = jnp.minimum(jnp.minimum(n_accepted + 1, first_eos + 1), limit - (n - 1))
        num_new = jnp.where(active, num_new, 0)
        if greedy:  # T5X's greedy score: the adjusted distribution is one-hot
            log_prob = jnp.zeros((batch,), jnp.float32)
        else:
            log_p = jnp.log(p_token(new_tokens))  # [b, γ + 1]
            log_prob = jnp.sum(jnp.where(slots < num_new[:, None], log_p, 0.0), axis=1)

        def write(row_buffer, row_new, start, count):
            window = jax.lax.dynamic_slice(row_buffer, (start,), (gamma + 1,))
            window = jnp.where(slots < count, row_new, window)
            return jax.lax.dynamic_update_slice(row_buffer, window, (start,))

        buffer = jax.vmap(write)(state.buffer, new_tokens, n, num_new)
        new_length = n + num_new
        ended = active & ((first_eos < num_new) | (new_length - 1 >= limit))

        # 5. Statistics of this iteration (zero for rows already done).
        tested = jnp.minimum(jnp.minimum(n_accepted + 1, num_drafts), num_new)
        accepted = jnp.minimum(n_accepted, num_new)
        s = state.stats
        stats = SpeculativeStats(
            num_iterations=s.num_iterations + active,
            num_draft_tokens=s.num_draft_tokens + tested,
            num_accepted=s.num_accepted + accepted,
            accept_histogram=s.accept_histogram
            + (jax.nn.one_hot(accepted, gamma + 1, dtype=jnp.int32) * active[:, None]),
            beta_sum=s.beta_sum + jnp.sum(jnp.where(slots[:gamma] < tested[:, None], beta, 0), 1),
            num_beta=s.num_beta + tested,
            num_generated=s.num_generated + num_new,
            num_proposed=s.num_proposed + jnp.where(active, num_drafts, 0),
            log_prob=s.log_prob + log_prob,
        )
        return _LoopState(
            buffer=buffer,
            length=new_length,
            draft_behind=active & (n_accepted == num_drafts),
            done=state.done | ended,
            target_cache=tc,
            draft_cache=dc,
            rng=rng,
            stats=stats,
        )

    final = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, init)
    return final.buffer[:, 1 : max_len + 1], final.stats


def _tree_sample(*args, gamma, verification, draft_confidence_threshold, tree, **kwargs):
    """`tree_decoding.tree_sample` after the checks of the arguments it does not take."""
    shape = tree_lib.parse_tree(tree)
    if gamma is not None and gamma != shape.max_depth:
        raise ValueError(
            f"gamma must be None or the tree's depth {shape.max_depth} with tree={tree!r}; got "
            f"gamma={gamma!r}."
        )
    if verification != "token" or draft_confidence_threshold:
        raise ValueError(
            "tree speculation has its own verification (tree_rule) and no early exit; got "
            f"verification={verification!r}, draft_confidence_threshold="
            f"{draft_confidence_threshold!r}."
        )
    from specdec_t5x import tree_decoding  # local: it imports this module

    return tree_decoding.tree_sample(*args, tree=shape, **kwargs)


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
