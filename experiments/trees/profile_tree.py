"""Where one token-tree iteration's time goes: its components timed apart, beside a chain's.

  python experiments/trees/profile_tree.py                                   # embedded pair, CPU
  python experiments/trees/profile_tree.py --target_shape base --repeats 7   # target widened to T5 1.1 base
  python experiments/trees/profile_tree.py --repeats 2 --reps 2 --out /tmp/p # smoke

On one DDTP En→De source (the first of the test split) with the shipped embedded pair
(gin/experiments/embedded_ende_model_t0.gin: 13.6M target, 2.7M draft, T = 0), every measurement
is a compiled function, warmed up, run `--reps` times inside one `fori_loop` that carries the
caches as the decode loop does (so cache writes stay in place), divided by `--reps`; the
measurements are interleaved (the order rotates every round) over `--repeats` rounds and the
median is reported (other processes share the machine: medians, not means).

Rows:
* `iteration/tree(...)`, `iteration/chain γ=g`: one whole decode (`speculative_sample`, caches
  prepared untimed) divided by its target calls: everything an iteration does.
* `body/tree(...)`: the tree loop's body alone (`tree_decoding.tree_iteration`), and
  `body/tree(...) no move`: the same with both steps' `move_slots` replaced by the identity
  (timing only: not exact).
* `verify/tree N=n`: the target's tree call on n nodes (a flat tree (n - 1,));
  `verify/chain k=n`: the target's ordinary n-token call (the chain's verify of γ = n - 1).
* `mask/tree(...)`: `tree.TreeQuery.attention` alone (slots, key positions, visible mask).
* `move/target`, `move/draft`: `move_slots` of the accepted path alone, per cache.
* `draft/tree(...)`: the draft's expansion of the tree (root call, one call per depth, children
  picked; at T > 0 by the rule 'without_replacement'); `draft/chain γ=g`: the chain's γ draft
  calls (argmax mode).
* `walk/tree(...)`: `verify_tree` alone on random logits (argmax mode: after the target's
  argmax at every node, every first child matching; T > 0: after the target's softmax at every
  node, rule 'without_replacement').

Rows `... lax.top_k` (on by default, `--no-lax_top_k` leaves them out) pick the children by
`jax.lax.top_k` as the loop did before `tree_decoding.top_k_indices`: the "before" of
results/trees/profile/README.md, timed interleaved with the "after". On a checkout without
`tree_decoding.tree_iteration` / `expand_tree` the `body` / `draft/tree` rows are left out.

Writes `<out>/<name>.json` and `.md` (ms per row, command, commit, hardware, date).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The cross-attention K/V are donated with the rest of a cache but never returned: harmless.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from specdec_t5x import provenance  # noqa: E402
from specdec_t5x import tree as tree_lib  # noqa: E402

EXPERIMENT = "gin/experiments/embedded_ende_model_t0.gin"


def _parse_tree(text: str) -> tree_lib.TreeShape:
    try:
        body = text.removeprefix("tree")
        if body.startswith("["):  # child-rank paths, digits per node: [0,1,00,000]
            paths = tuple(tuple(int(r) for r in p.strip()) for p in body.strip("[]").split(","))
            return tree_lib.TreeShape(paths=paths)
        return tree_lib.TreeShape(tuple(int(x) for x in body.strip("()").split(",") if x.strip()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"a tree is comma-separated branching factors, e.g. 3,2,1, or child-rank paths in "
            f"brackets, e.g. [0,1,00,000]; got {text!r} ({e})"
        ) from e


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints; got {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1; got {text!r}")
    return values


def load_pair(target_shape: str | None, experiment: str = EXPERIMENT):
    """(spec_model, target_params, draft_params, encoder tokens int32 [1, input_len], max_len)."""
    import gin

    from specdec_t5x import inputs as inputs_lib
    from specdec_t5x.eval import pairs

    bindings = [f"TARGET_SHAPE = '{target_shape}'"] if target_shape else []
    gin.clear_config()
    spec_model, params, draft_params = pairs.load_pair_from_gin([experiment], bindings)
    query = lambda name: gin.query_parameter(f"%{name}")  # noqa: E731
    examples, _, _ = inputs_lib.load_examples(
        query("TASK"), query("SPLIT"), 1, query("INPUT_LEN"), query("TARGET_LEN"),
        spec_model.output_vocabulary,
    )  # fmt: skip
    max_len = int(query("TARGET_LEN"))
    batch = inputs_lib.decode_batch([examples[0]["inputs"]], int(query("INPUT_LEN")), max_len)
    return spec_model, params, draft_params, batch["encoder_input_tokens"], max_len


class Profiler:
    """Builds the measured functions for one model pair (see the module docstring)."""

    def __init__(self, spec_model, params, draft_params, enc, max_len, reps, prefix, temperature):
        self.spec_model, self.params, self.draft_params = spec_model, params, draft_params
        self.enc, self.max_len, self.reps, self.prefix = enc, max_len, reps, prefix
        self.temperature = temperature  # of the `iteration` and `body` rows
        self._states = {}

    def states(self, slots: int):
        """((target_cache, target_step), (draft_cache, draft_step)) with `slots` decoder slots,
        the first `prefix` positions filled (a source-conditioned prefix of arbitrary tokens)."""
        if slots not in self._states:
            (tc, ts), (dc, ds) = self.spec_model.states(
                self.params, self.draft_params, self.enc, slots
            )
            prefix = jnp.arange(3, 3 + self.prefix, dtype=jnp.int32)[None]
            zero = jnp.zeros((1,), jnp.int32)
            tc = jax.jit(lambda c: ts(prefix, zero, c)[1])(tc)
            dc = jax.jit(lambda c: ds(prefix, zero, c)[1])(dc)
            self._states[slots] = (tc, ts), (dc, ds)
        return self._states[slots]

    def _looped(self, fn, carry):
        """A `() -> seconds` timing a compiled function that runs `fn(i, carry, bump) -> (carry,
        scalar)` `reps` times in one `fori_loop`; the scalar feeds `bump` (always 0) into the next
        rep, so nothing is hoisted. The carry is donated (a fresh copy, made untimed, per call), so
        the loop updates it in place as the decode loop does instead of copying it per call."""
        reps = self.reps

        def run(carry):
            def body(i, state):
                carry, acc = state
                carry, value = fn(i, carry, (acc > 1e30).astype(jnp.int32))
                return carry, acc + value

            return jax.lax.fori_loop(0, reps, body, (carry, jnp.float32(0)))

        compiled = jax.jit(run, donate_argnums=0)

        def timed():
            fresh = jax.block_until_ready(jax.tree_util.tree_map(jnp.copy, carry))
            start = time.perf_counter()
            jax.block_until_ready(compiled(fresh))
            return time.perf_counter() - start

        timed()  # compiles now (under the caller's settings, e.g. `_children_by_lax_top_k`)
        return timed

    def verify(self, n: int, tree: bool):
        slots = self.max_len + n - 1
        (tc, ts), _ = self.states(slots)
        tokens = jnp.arange(5, 5 + n, dtype=jnp.int32)[None]
        query = tree_lib.TreeQuery(tree_lib.TreeShape((n - 1,)), tuple(range(n))) if tree else None

        def fn(i, cache, bump):
            start = jnp.full((1,), self.prefix, jnp.int32) + bump
            if tree:
                logits, cache = ts(tokens, start, cache, tree=query)
            else:
                logits, cache = ts(tokens, start, cache)
            return cache, logits[0, -1, 0]

        return self._looped(fn, tc)

    def mask(self, shape: tree_lib.TreeShape):
        slots = self.max_len + shape.num_nodes - 1
        query = tree_lib.TreeQuery(shape, tuple(range(shape.num_nodes)))

        def fn(i, carry, bump):
            start = jnp.full((1,), self.prefix, jnp.int32) + bump + carry
            positions, attention = query.attention(start, slots)
            value = (
                jnp.sum(positions)
                + jnp.sum(attention.slots)
                + jnp.sum(attention.key_positions)
                + jnp.sum(attention.visible)
            ).astype(jnp.float32)
            return carry, value

        return self._looped(fn, jnp.zeros((), jnp.int32))

    def move(self, shape: tree_lib.TreeShape, which: str):
        slots = self.max_len + shape.num_nodes - 1
        (tc, ts), (dc, ds) = self.states(slots)
        cache, step = (tc, ts) if which == "target" else (dc, ds)
        leaf = jax.tree_util.tree_leaves(cache)[0]
        path = jnp.asarray([[0] + [int(shape.offsets[d]) for d in range(1, shape.max_depth + 1)]])

        def fn(i, cache, bump):
            start = jnp.full((1,), self.prefix, jnp.int32) + bump
            cache = step.move_slots(cache, start, path + (i % 2))
            return cache, jnp.float32(0)

        del leaf
        return self._looped(fn, cache)

    def draft_tree(self, shape: tree_lib.TreeShape):
        from specdec_t5x import sampling, tree_decoding

        slots = self.max_len + shape.num_nodes - 1
        _, (dc, ds) = self.states(slots)

        def fn(i, cache, bump):
            start = jnp.full((1,), self.prefix, jnp.int32) + bump
            last = jnp.full((1,), 7, jnp.int32)
            root_logits, cache = ds(last[:, None], start, cache)
            temperature = self.temperature
            greedy = sampling.is_greedy(temperature)
            adjust = lambda logits: sampling.adjust_logits(logits, temperature)  # noqa: E731
            rng = None if greedy else jax.random.fold_in(jax.random.PRNGKey(2), i)
            tokens, _, cache = tree_decoding.expand_tree(
                ds, shape, last, root_logits[:, 0], start, cache, "without_replacement", greedy,
                adjust, rng,
            )  # fmt: skip
            return cache, jnp.sum(tokens).astype(jnp.float32)

        return self._looped(fn, dc)

    def draft_chain(self, gamma: int):
        _, (dc, ds) = self.states(self.max_len)

        def fn(i, cache, bump):
            start = jnp.full((1,), self.prefix, jnp.int32) + bump
            token = jnp.full((1, 1), 7, jnp.int32)
            total = jnp.float32(0)
            for g in range(gamma):
                logits, cache = ds(token, start + g, cache)
                token = jnp.argmax(logits, -1).astype(jnp.int32)
                total = total + token[0, 0]
            return cache, total

        return self._looped(fn, dc)

    def body(self, shape: tree_lib.TreeShape, move: bool):
        from specdec_t5x import tree_decoding
        from specdec_t5x.sampling import SamplingSettings
        from specdec_t5x.speculation import Speculation

        slots = self.max_len + shape.num_nodes - 1
        (tc, ts), (dc, ds) = self.states(slots)
        if not move:
            ts, ds = _without_move(ts), _without_move(ds)
        inputs = jnp.zeros((1, self.max_len), jnp.int32)
        init, body = tree_decoding.tree_iteration(
            inputs,
            tc,
            ts,
            dc,
            ds,
            self.spec_model.eos_id,
            sampling=SamplingSettings(self.temperature),
            speculation=Speculation(tree=shape),
        )
        # Start from a row `prefix` tokens in (arbitrary tokens); the body's work does not depend
        # on whether the row has ended.
        state = init.replace(length=jnp.full((1,), self.prefix, jnp.int32))

        def fn(i, state, bump):
            state = body(state.replace(length=jnp.full((1,), self.prefix, jnp.int32) + bump))
            return state, state.length[0].astype(jnp.float32)

        return self._looped(fn, state)

    def walk(self, shape: tree_lib.TreeShape):
        """`verify_tree` alone on random logits where every first child is the target's argmax
        (argmax mode: the longest walk), after the target's argmax at every node; at T > 0 after
        the target's softmax at every node, against a draft q = (p + uniform) / 2 (rule
        'without_replacement')."""
        from specdec_t5x import sampling, tree_decoding

        k, vocab, temperature = shape.num_nodes, 8192, self.temperature
        logits = jax.random.normal(jax.random.PRNGKey(0), (1, k, vocab))
        tokens = jnp.argmax(logits, -1).astype(jnp.int32)
        tokens = jnp.take(tokens, jnp.asarray(np.maximum(shape.parent, 0)), axis=1)
        valid = jnp.ones((1, k), bool)
        greedy = sampling.is_greedy(temperature)

        def fn(i, carry, bump):
            shifted = logits + bump.astype(jnp.float32)
            if greedy:
                kwargs = dict(target_argmax=sampling.first_argmax(shifted))
            else:
                p = jax.nn.softmax(sampling.adjust_logits(shifted, temperature), axis=-1)
                q = 0.5 * p[:, : shape.num_inner] + 0.5 / vocab
                kwargs = dict(p=p, q=q, rng=jax.random.fold_in(jax.random.PRNGKey(1), i))
            verdict = tree_decoding.verify_tree(
                shape, tokens, valid, "without_replacement", **kwargs
            )
            return carry, (verdict.path.sum() + verdict.extra.sum()).astype(jnp.float32)

        return self._looped(fn, jnp.zeros((), jnp.int32))

    def decode(self, shape: tree_lib.TreeShape | None, gamma: int):
        """A whole decode (`speculative_sample`, argmax mode, fresh caches prepared untimed) and
        its target calls."""
        from specdec_t5x import speculative

        slots = self.max_len + (0 if shape is None else shape.num_nodes - 1)
        spec = self.spec_model
        inputs = jnp.zeros((1, self.max_len), jnp.int32)
        prepare = jax.jit(
            lambda: tuple(
                c for c, _ in spec.states(self.params, self.draft_params, self.enc, slots)
            )
        )
        (_, ts), (_, ds) = spec.states(self.params, self.draft_params, self.enc, slots)
        kwargs = dict(gamma=gamma) if shape is None else dict(tree=shape.spec)

        def run(caches):
            tc, dc = caches
            return speculative.speculative_sample(
                inputs, tc, ts, dc, ds, spec.eos_id, temperature=self.temperature, **kwargs
            )

        compiled = jax.jit(run, donate_argnums=0)
        _, stats = compiled(prepare())
        calls = int(np.max(np.asarray(stats.num_iterations)))

        def call():
            caches = jax.block_until_ready(prepare())
            start = time.perf_counter()
            jax.block_until_ready(compiled(caches))
            return time.perf_counter() - start

        return call, calls


def _without_move(step):
    def wrapped(tokens, positions, cache, tree=None):
        return step(tokens, positions, cache, tree=tree)

    wrapped.move_slots = lambda cache, start, path: cache
    wrapped.cache_slots = step.cache_slots
    return wrapped


def _lax_top_k(x, k):
    """The children as the tree loop picked them before `tree_decoding.top_k_indices`."""
    return jax.lax.top_k(x, k)[1].astype(jnp.int32)


@contextlib.contextmanager
def _children_by_lax_top_k():
    """Functions compiled inside pick the tree's children by `jax.lax.top_k` (the "before")."""
    from specdec_t5x import tree_decoding

    saved = tree_decoding.top_k_indices
    tree_decoding.top_k_indices = _lax_top_k
    try:
        yield
    finally:
        tree_decoding.top_k_indices = saved


def measure(args) -> dict:
    from specdec_t5x import tree_decoding

    has_body = hasattr(tree_decoding, "tree_iteration")  # older checkouts: fewer rows
    has_expand = hasattr(tree_decoding, "expand_tree")
    spec_model, params, draft_params, enc, max_len = load_pair(args.target_shape)
    prof = Profiler(
        spec_model, params, draft_params, enc, max_len, args.reps, args.prefix, args.temperature
    )
    trees = list(args.trees)
    rows, per_call = {}, {}  # name -> () -> None; name -> divisor (calls of a whole decode)
    for g in args.gammas:
        call, calls = prof.decode(None, g)
        rows[f"iteration/chain γ={g}"], per_call[f"iteration/chain γ={g}"] = call, calls
    for t in trees:
        name = t.name
        call, calls = prof.decode(t, t.max_depth)
        rows[f"iteration/{name}"], per_call[f"iteration/{name}"] = call, calls
        if has_body:
            rows[f"body/{name}"] = prof.body(t, move=True)
            rows[f"body/{name} no move"] = prof.body(t, move=False)
        rows[f"mask/{name}"] = prof.mask(t)
        rows[f"move/target {name}"] = prof.move(t, "target")
        rows[f"move/draft {name}"] = prof.move(t, "draft")
        if has_expand:
            rows[f"draft/{name}"] = prof.draft_tree(t)
        rows[f"walk/{name}"] = prof.walk(t)
        if args.lax_top_k and hasattr(tree_decoding, "top_k_indices"):
            with _children_by_lax_top_k():  # compiled now, timed interleaved with the rest
                before = f"{name} lax.top_k"
                call, calls = prof.decode(t, t.max_depth)
                rows[f"iteration/{before}"], per_call[f"iteration/{before}"] = call, calls
                rows[f"body/{before}"] = prof.body(t, move=True)
                rows[f"draft/{before}"] = prof.draft_tree(t)
    for g in args.gammas:
        rows[f"draft/chain γ={g}"] = prof.draft_chain(g)
    for n in args.nodes:
        if n > 1:  # a tree has a root and at least one child; k = 1 is the one-token step
            rows[f"verify/tree N={n}"] = prof.verify(n, tree=True)
        rows[f"verify/chain k={n}"] = prof.verify(n, tree=False)
    for g in args.gammas:
        if g + 1 not in args.nodes:
            rows[f"verify/chain k={g + 1}"] = prof.verify(g + 1, tree=False)
    for fn in rows.values():  # warm (compiled when made)
        fn()
    names = list(rows)
    seconds = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            seconds[name].append(rows[name]())
    ms = {}
    for name in names:
        divisor = per_call.get(name, args.reps)
        ms[name] = {
            "median_ms": 1e3 * float(np.median(seconds[name])) / divisor,
            "min_ms": 1e3 * float(np.min(seconds[name])) / divisor,
            "per": "target call of a whole decode" if name in per_call else "fori_loop rep",
            "divisor": divisor,
        }
    return {
        "target_shape": args.target_shape or "shipped",
        "trees": [t.name for t in trees],
        "gammas": args.gammas,
        "nodes": args.nodes,
        "repeats": args.repeats,
        "reps": args.reps,
        "prefix": args.prefix,
        "lax_top_k": args.lax_top_k,
        "temperature": args.temperature,
        "max_decode_len": max_len,
        "rows": ms,
    }


def table(result: dict) -> str:
    lines = [
        f"# One tree iteration's components ({result['target_shape']} target, CPU, "
        f"T = {result.get('temperature', 0.0):g} in the iteration, body, walk, draft/tree rows)",
        "",
        "| row | median ms | min ms | per |",
        "|---|---:|---:|---|",
    ]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['median_ms']:.3f} | {row['min_ms']:.3f} | {row['per']} |")
    lines.append("")
    lines += [f"- {note}" for note in provenance.markdown_lines(result)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )  # fmt: skip
    parser.add_argument("--target_shape", default=None, help="None (shipped), small, base, large")
    parser.add_argument(
        "--trees", type=_parse_tree, nargs="+", default=[tree_lib.TreeShape((3, 2, 1))]
    )
    parser.add_argument("--gammas", type=_ints, default=[2], help="chain γs, e.g. 2,5")
    parser.add_argument("--nodes", type=_ints, default=[4, 8, 16, 31], help="verify sizes")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="of the iteration, body, walk and draft/tree rows (the others run argmax mode)",
    )
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds (median)")
    parser.add_argument("--reps", type=int, default=20, help="calls per fori_loop measurement")
    parser.add_argument("--prefix", type=int, default=16, help="decoded positions before a call")
    parser.add_argument(
        "--lax_top_k",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also rows with the children picked by jax.lax.top_k (before top_k_indices)",
    )
    parser.add_argument("--name", default=None, help="output file stem")
    parser.add_argument("--out", default="results/trees/profile")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.reps < 1:
        parser.error(f"--repeats and --reps must be >= 1; got {args.repeats}, {args.reps}")
    result = measure(args)
    name = args.name or f"profile_{args.target_shape or 'shipped'}_t{args.temperature:g}"
    command = shlex.join(
        ["python", "experiments/trees/profile_tree.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(result, args.out, name, command, table)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
