"""What token trees can buy at T = 0, from the draft's ranks of the target's own tokens.

  python experiments/trees/tree_ceiling.py                       # shipped En→De pair, 100 test sentences
  python experiments/trees/tree_ceiling.py --tk results/trees/profile/tk_base_t0.json   # + predicted speed
  python experiments/trees/tree_ceiling.py --split validation    # choose trees on other sentences
  python experiments/trees/tree_ceiling.py --dynamic 4,4,6       # + trees chosen per iteration (EAGLE-2)
  python experiments/trees/tree_ceiling.py --num_examples 5 --out /tmp/c                 # smoke

In argmax mode an iteration accepts the longest path of its tree that the target's greedy
continuation follows, and a node's children are the draft's top choices after the node's path.
So the draft's rank of every greedy token, teacher-forced on that token's prefix (one target
decode and one draft forward pass per example), gives the tokens per target call of *any* tree
(chain, per-depth branching, child-rank paths) without decoding with it, exactly up to the
numerics of a teacher-forced pass, and `tree.optimal_paths` the tree of each size that would have
accepted the most on these sentences (each example's starts all counted).

For every row budget k (target rows per verify call, root included) the table gives the chain
γ = k - 1, the best per-depth tree of exactly k nodes, and the optimal tree of k nodes: tokens per
target call, and over the fastest chain's. With `--tk` (a `experiments/trees/profile_tree.py` JSON whose
`verify/tree N=n` rows time the target's call on n rows) it also predicts each tree's speed over
the fastest chain's as (tokens / T(k)) / max over chains of (tokens / T(γ + 1)): the target's verify
call only (the draft's calls and the loop's own work left out; T(k) interpolated linearly between
measured k).

Writes `<out>/<name>.json` (ranks' summary, path counts, every row, optimal paths) and `.md`
(table, command, commit, hardware, date).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import shlex
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from specdec_t5x import provenance  # noqa: E402
from specdec_t5x import tree as tree_lib  # noqa: E402

EXPERIMENT = "gin/experiments/embedded_ende_model_t0.gin"
BUILD = [
    "target/gin_utils.build.obj = %MODEL",
    "draft/gin_utils.build.obj = %DRAFT_MODEL",
    "tparams/gin_utils.build.obj = %TARGET_PARAMS",
    "dparams/gin_utils.build.obj = %DRAFT_PARAMS",
    "shortlist/gin_utils.build.obj = @drafts.ngram_shortlist()",
]
MAX_RANK = 8  # ranks counted: 0..MAX_RANK - 1 (a token past them ends every path)


def greedy_ranks(experiment: str, num_examples: int, split: str | None = None):
    """The target's greedy decodes and the draft's rank of each of their tokens.

    Returns:
      ranks int32 [n, max_decode_len] (MAX_RANK where the token is not among the draft's top
      MAX_RANK), lengths int32 [n] (tokens up to and including EOS), top1 float32 [n,
      max_decode_len] (the draft's probability of its first choice there), a description dict
      and `draft_log_probs(example, prefixes) -> float32 [len(prefixes), vocab]`: the draft's
      log-probabilities (shortlist applied) of the token after each prefix (a list of decoded
      tokens) of that example, for `dynamic_tokens_per_call`.

    Raises:
      ValueError: an experiment whose draft is not a T5 draft (no DRAFT_MODEL macro).
    """
    import gin
    import jax
    import jax.numpy as jnp

    from specdec_t5x import gin_utils
    from specdec_t5x import inputs as inputs_lib
    from specdec_t5x.eval import pairs

    gin.clear_config()
    pairs.parse_config([experiment], [], finalize=False)
    if "DRAFT_MODEL" not in gin_utils.defined_macros():
        raise ValueError(
            f"{experiment} has no DRAFT_MODEL macro: tree_ceiling ranks a T5 draft's choices "
            "(gin/models/embedded_*_draft.gin)."
        )
    gin.clear_config()
    bindings = [] if split is None else [f"SPLIT = '{split}'"]
    pairs.parse_config([experiment], [*BUILD, *bindings], finalize=False)
    built = {}
    for scope in ("target", "draft", "tparams", "dparams", "shortlist"):
        with gin.config_scope(scope):
            built[scope] = gin_utils.build()
    query = lambda name: gin.query_parameter(f"%{name}")  # noqa: E731
    model, draft = built["target"], built["draft"]
    input_len, max_len = int(query("INPUT_LEN")), int(query("TARGET_LEN"))
    examples, _, _ = inputs_lib.load_examples(
        query("TASK"), query("SPLIT"), num_examples, input_len, max_len,
        model.output_vocabulary,
    )  # fmt: skip
    batch = inputs_lib.decode_batch([e["inputs"] for e in examples], input_len, max_len)
    out = np.asarray(jax.jit(model.predict_batch)(built["tparams"], batch))  # [n, L]
    forced = {
        "encoder_input_tokens": batch["encoder_input_tokens"],
        "decoder_input_tokens": jnp.pad(jnp.asarray(out)[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": jnp.asarray(out),
    }
    logits = np.asarray(jax.jit(draft.logits)(built["dparams"], forced))  # [n, L, V]
    allowed = np.zeros(logits.shape[-1], bool)
    allowed[np.asarray(built["shortlist"])] = True  # the shipped draft ranks its shortlist only
    logits = np.where(allowed, logits, -np.inf)
    top = np.argsort(-logits, axis=-1, kind="stable")[..., :MAX_RANK]  # [n, L, R]
    hit = top == out[..., None]
    ranks = np.where(hit.any(-1), hit.argmax(-1), MAX_RANK).astype(np.int32)
    top1 = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1).max(-1), np.float32)
    eos = model.eos_id
    lengths = np.asarray(
        [int(np.argmax(row == eos)) + 1 if (row == eos).any() else len(row) for row in out]
    )
    about = {
        "experiment": experiment,
        "task": query("TASK"),
        "split": query("SPLIT"),
        "examples": len(examples),
        "draft": str(query("DRAFT_NAME")),
        "target_tokens": int(lengths.sum()),
    }
    enc = batch["encoder_input_tokens"]
    mask = jnp.where(jnp.asarray(allowed), 0.0, -jnp.inf)

    @jax.jit
    def last_log_probs(enc_row, dec_in, pos):  # dec_in int32 [m, L], pos int32 [m]
        fed = {
            "encoder_input_tokens": jnp.broadcast_to(enc_row, (dec_in.shape[0], enc_row.shape[0])),
            "decoder_input_tokens": dec_in,
            "decoder_target_tokens": (jnp.arange(max_len)[None] <= pos[:, None]).astype(jnp.int32),
        }  # the target tokens only mark the positions that are not padding
        logits = jnp.take_along_axis(draft.logits(built["dparams"], fed), pos[:, None, None], 1)
        return jax.nn.log_softmax(logits[:, 0] + mask, axis=-1)

    def draft_log_probs(example: int, prefixes) -> np.ndarray:
        dec = np.zeros((len(prefixes), max_len), np.int32)
        for i, prefix in enumerate(prefixes):
            seq = [0, *prefix][:max_len]  # decoder inputs: the start token, then the tokens
            dec[i, : len(seq)] = seq
        pos = np.asarray([min(len(p), max_len - 1) for p in prefixes], np.int32)
        return np.asarray(last_log_probs(enc[example], jnp.asarray(dec), jnp.asarray(pos)))

    return ranks, lengths, top1, about, draft_log_probs, out


def accepted_depth(ranks_row, start: int, length: int, paths: set, depth: int) -> int:
    """The longest path of the tree (`paths`: its child-rank paths) that the ranks from `start`
    follow, at most `depth` and not past `length`."""
    a, path = 0, ()
    while a < depth and start + a < length:
        path = path + (int(ranks_row[start + a]),)
        if path not in paths:
            break
        a += 1
    return a


def dynamic_accepted(log_probs, target, start, length, rows, width, k, depth) -> int:
    """Accepted depth of one iteration with a tree chosen per iteration (EAGLE-2, Li et al. 2024):
    at each depth the `width` candidates of highest cumulative draft log-probability are
    expanded, each into its draft's top `k`; the `rows - 1` candidates of highest cumulative
    log-probability (an ancestor's is never lower) are verified beside the root.

    Args:
      log_probs: (paths) -> float [len(paths), vocab], the draft's log-probabilities after the
        example's tokens before `start` followed by each path (a tuple of tokens).
      target: int [length] the target's greedy tokens; start, length: as `accepted_depth`.
    """
    candidates, frontier = [], [(0.0, ())]
    for _ in range(depth):
        lp = log_probs([path for _, path in frontier])
        grown = [
            (value + float(lp[i, t]), (*path, int(t)))
            for i, (value, path) in enumerate(frontier)
            for t in np.argsort(-lp[i], kind="stable")[:k]
        ]
        candidates += grown
        frontier = sorted(grown, key=lambda c: -c[0])[:width]
    chosen = {path for _, path in sorted(candidates, key=lambda c: -c[0])[: rows - 1]}
    a = 0
    while (
        a < depth
        and start + a < length
        and tuple(int(x) for x in target[start : start + a + 1]) in chosen
    ):
        a += 1
    return a


def dynamic_tokens_per_call(draft_log_probs, out, lengths, rows, width, k, depth) -> float:
    """Tokens per target call of the decode loop with `dynamic_accepted`'s trees (argmax mode).

    Args:
      draft_log_probs: (example, prefixes) -> float [len(prefixes), vocab] (`greedy_ranks`).
      out: int [n, max_decode_len] the target's greedy tokens; lengths: int [n].
    """
    calls = tokens = 0
    for b, length in enumerate(lengths):
        row, start = [int(x) for x in out[b]], 0
        while start < length:

            def log_probs(paths, b=b, row=row, s=start):
                return draft_log_probs(b, [row[:s] + list(p) for p in paths])

            a = dynamic_accepted(log_probs, row, start, length, rows, width, k, depth)
            new = min(a + 1, length - start)
            start, tokens, calls = start + new, tokens + new, calls + 1
    return tokens / calls


def tokens_per_call(ranks, lengths, shape: tree_lib.TreeShape) -> float:
    """Tokens per target call of the decode loop with `shape` in argmax mode (each iteration
    emits its accepted path and one more token, cut at the example's length)."""
    paths, depth = set(shape.node_paths[1:]), shape.max_depth
    calls = tokens = 0
    for row, length in zip(ranks, lengths, strict=True):
        start = 0
        while start < length:
            new = min(accepted_depth(row, start, length, paths, depth) + 1, length - start)
            start, tokens, calls = start + new, tokens + new, calls + 1
    return tokens / calls


def path_counts(ranks, lengths, max_depth: int) -> collections.Counter:
    """{child-rank path: how many starts (every position of every example) it is a prefix of the
    target's continuation from}, paths up to `max_depth` with ranks < MAX_RANK."""
    counts = collections.Counter()
    for row, length in zip(ranks, lengths, strict=True):
        for start in range(length):
            path = ()
            for j in range(min(max_depth, length - start)):
                if row[start + j] >= MAX_RANK:
                    break
                path = path + (int(row[start + j]),)
                counts[path] += 1
    return counts


def branchings(num_nodes: int, max_depth: int):
    """Every per-depth branching tuple of exactly `num_nodes` nodes (root included)."""

    def grow(prefix, width, used):
        if used == num_nodes and prefix:
            yield tuple(prefix)
        if len(prefix) == max_depth:
            return
        for b in range(1, num_nodes):
            if used + width * b > num_nodes:
                break
            yield from grow([*prefix, b], width * b, used + width * b)

    yield from grow([], 1, 1)


CONFIDENCE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.95, 1.0)


def by_confidence(ranks, top1) -> list[dict[str, float]]:
    """How often the draft's first, second and later choices are the target's token, by the
    draft's probability of its first choice (ranks int32 [n], top1 float32 [n], flat)."""
    out = []
    for lo, hi in zip(CONFIDENCE_BINS[:-1], CONFIDENCE_BINS[1:], strict=True):
        m = (top1 >= lo) & ((top1 < hi) | (hi == CONFIDENCE_BINS[-1]))
        r = ranks[m]
        if not r.size:
            continue
        out.append(
            {"q_top1": [lo, hi], "tokens": int(m.sum()), "share": float(m.mean()),
             "first": float(np.mean(r == 0)), "second": float(np.mean(r == 1)),
             "later_or_none": float(np.mean(r >= 2))}
        )  # fmt: skip
    return out


def load_tk(path: str) -> dict[int, float]:
    """{rows n: ms} of the target's call on n rows from a profile_tree JSON (`verify/tree N=n`,
    or `verify/chain k=n` where no tree row was timed)."""
    rows = json.loads(pathlib.Path(path).read_text())["rows"]
    tk = {}
    for name, row in rows.items():
        for prefix in ("verify/chain k=", "verify/tree N="):  # tree rows win
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                tk[int(name[len(prefix) :])] = float(row["median_ms"])
    if not tk:
        raise ValueError(f"{path} has no 'verify/tree N=n' rows (experiments/trees/profile_tree.py --nodes).")
    return tk


def cost(tk: dict[int, float], k: int) -> float:
    """T(k) in ms, linear between measured k (beyond them: the last two points' slope)."""
    ks = sorted(tk)
    if k in tk:
        return tk[k]
    if k < ks[0]:
        return tk[ks[0]]
    lo = max([x for x in ks if x < k], default=ks[-2])
    hi = min([x for x in ks if x > k], default=ks[-1])
    if hi == lo:
        lo = ks[-2]
    return tk[lo] + (tk[hi] - tk[lo]) * (k - lo) / (hi - lo)


def ceiling_rows(ranks, lengths, max_rows: int, max_depth: int, tk=None):
    """One row per row budget k = 2..max_rows (see the module's docstring)."""
    counts = path_counts(ranks, lengths, max_depth)
    rows = []
    for k in range(2, max_rows + 1):
        chain = tree_lib.TreeShape((1,) * (k - 1))
        best_b, best_b_tokens = None, -1.0
        for b in branchings(k, max_depth):
            if b == chain.branching:
                continue
            t = tokens_per_call(ranks, lengths, tree_lib.TreeShape(b))
            if t > best_b_tokens:
                best_b, best_b_tokens = b, t
        optimal = tree_lib.TreeShape(paths=tree_lib.optimal_paths(counts, k))
        rows.append(
            {
                "rows": k,
                "chain": tokens_per_call(ranks, lengths, chain),
                "branching": None if best_b is None else tree_lib.tree_name(best_b),
                "branching_tokens": None if best_b is None else best_b_tokens,
                "optimal": optimal.name,
                "optimal_paths": [list(p) for p in optimal.node_paths[1:]],
                "optimal_tokens": tokens_per_call(ranks, lengths, optimal),
                "cost_ms": None if tk is None else cost(tk, k),
            }
        )
    best_chain_tokens = max(r["chain"] for r in rows)
    if tk is not None:
        best_chain_rate = max(r["chain"] / r["cost_ms"] for r in rows)
    for r in rows:
        r["optimal_over_best_chain_tokens"] = r["optimal_tokens"] / best_chain_tokens
        if tk is not None:
            r["chain_speed"] = r["chain"] / r["cost_ms"] / best_chain_rate
            r["optimal_speed"] = r["optimal_tokens"] / r["cost_ms"] / best_chain_rate
            if r["branching_tokens"] is not None:
                r["branching_speed"] = r["branching_tokens"] / r["cost_ms"] / best_chain_rate
    return rows, counts


def markdown(result: dict) -> str:
    about, rows, tk = result["about"], result["rows"], result["tk"] is not None
    f = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    head = "| rows k | chain γ = k − 1 | best per-depth tree of k | its tokens | optimal tree of k | its tokens | × best chain's tokens |"
    sep = "|---|---|---|---|---|---|---|"
    if tk:
        head += " T(k) ms | predicted speed × fastest chain: chain / per-depth / optimal |"
        sep += "---|---|"
    lines = [
        f"# Tokens per target call of any tree at T = 0: {about['task']} {about['split']}, "
        f"{about['examples']} examples, draft {about['draft']}",
        "",
        f"From the draft's rank of each of the target's {about['target_tokens']} greedy tokens "
        f"(teacher-forced); draft's first choice right {result['rank0']:.3f} of the time, second "
        f"after a wrong first {result['rank1_given_miss']:.3f}, third after two wrong "
        f"{result['rank2_given_miss']:.3f}.",
        "",
        "At T = 0 an iteration accepts the longest path of its tree that the target's greedy tokens "
        "follow, so these ranks give every tree's tokens per target call exactly, as the decode "
        "loop would run it (`experiments/trees/tree_ceiling.py`). Rows k: the target's rows per verify call, "
        "root included. Optimal tree of k: `tree.optimal_paths` on the child-rank paths counted "
        "from every position of these examples (the loop starts at some of them only, so on few "
        "examples a per-depth tree can beat it). × best chain's tokens: over the most tokens per "
        "call any chain of these row budgets makes."
        + (
            " Predicted speed: (tokens / T(k)) over the fastest chain's, the target's verify call "
            "only."
            if tk
            else ""
        ),
        "",
        head,
        sep,
    ]
    for r in rows:
        line = (
            f"| {r['rows']} | {f(r['chain'])} | {r['branching'] or '–'} | "
            f"{f(r['branching_tokens'])} | {r['optimal']} | {f(r['optimal_tokens'])} | "
            f"{f(r['optimal_over_best_chain_tokens'])} |"
        )
        if tk:
            line += (
                f" {r['cost_ms']:.1f} | {f(r['chain_speed'])} / {f(r.get('branching_speed'))} / "
                f"{f(r['optimal_speed'])} |"
            )
        lines.append(line)
    if tk:
        lines += ["", f"T(k): `{result['tk']['path']}`."]
    if result.get("dynamic"):
        dyn = result["dynamic"]
        by_rows = {r["rows"]: r for r in rows}
        lines += [
            "",
            f"Trees chosen per iteration (EAGLE-2: expand the {dyn['width']} candidates of highest "
            f"cumulative draft log-probability per depth into their top {dyn['k']}, to depth "
            f"{dyn['depth']}; verify the k - 1 best): tokens per target call",
            "",
            "| rows k | chosen per iteration | optimal tree of k (above) |",
            "|---|---|---|",
            *(
                f"| {n} | {t:.2f} | {f(by_rows[int(n)]['optimal_tokens']) if int(n) in by_rows else '–'} |"
                for n, t in dyn["tokens_per_call"].items()
            ),
        ]
    lines += [
        "",
        "Which choice of the draft is the target's token, by the draft's probability of its first "
        "choice:",
        "",
        "| draft's q(first choice) | share of tokens | first | second | later or none |",
        "|---|---|---|---|---|",
        *(
            f"| {b['q_top1'][0]:.2f}–{b['q_top1'][1]:.2f} | {b['share']:.2f} | {b['first']:.2f} | "
            f"{b['second']:.2f} | {b['later_or_none']:.2f} |"
            for b in result["by_confidence"]
        ),
    ]
    lines += ["", *(f"- {note}" for note in provenance.markdown_lines(result))]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gin_file", default=EXPERIMENT, help="an experiment with a T5 draft")
    parser.add_argument("--num_examples", type=int, default=100, help="first N of the split")
    parser.add_argument("--split", default=None, help="the experiment's SPLIT unless given")
    parser.add_argument("--max_rows", type=int, default=16, help="largest row budget k")
    parser.add_argument("--max_depth", type=int, default=8, help="deepest tree considered")
    parser.add_argument("--tk", default=None, help="profile_tree JSON with verify/tree N=n rows")
    parser.add_argument(
        "--dynamic",
        default=None,
        help="also trees chosen per iteration (EAGLE-2): WIDTH,K,DEPTH, e.g. 4,4,6 (slow: one "
        "draft pass per depth and iteration)",
    )
    parser.add_argument("--dynamic_rows", default="6,9,12", help="row budgets of --dynamic")
    parser.add_argument("--out", default="results/trees/ceiling", help="output folder")
    parser.add_argument("--name", default="ceiling_ende_t0", help="output file stem")
    args = parser.parse_args(argv)
    if args.num_examples < 1 or args.max_rows < 2 or args.max_depth < 1:
        parser.error("--num_examples >= 1, --max_rows >= 2 and --max_depth >= 1 are needed.")
    tk = None if args.tk is None else load_tk(args.tk)
    ranks, lengths, top1, about, draft_log_probs, out = greedy_ranks(
        args.gin_file, args.num_examples, args.split
    )
    rows, counts = ceiling_rows(ranks, lengths, args.max_rows, args.max_depth, tk)
    dynamic = None
    if args.dynamic:
        width, k, depth = (int(x) for x in args.dynamic.split(","))
        dynamic = {
            "width": width,
            "k": k,
            "depth": depth,
            "tokens_per_call": {
                n: dynamic_tokens_per_call(draft_log_probs, out, lengths, n, width, k, depth)
                for n in (int(x) for x in args.dynamic_rows.split(","))
            },
        }
    flat = np.concatenate([r[:n] for r, n in zip(ranks, lengths, strict=True)])
    conf = np.concatenate([c[:n] for c, n in zip(top1, lengths, strict=True)])
    result = {
        "about": about,
        "rank0": float(np.mean(flat == 0)),
        "rank1_given_miss": float(np.mean(flat[flat >= 1] == 1)),
        "rank2_given_miss": float(np.mean(flat[flat >= 2] == 2)),
        "rows": rows,
        "by_confidence": by_confidence(flat, conf),
        "dynamic": dynamic,
        "path_counts": {
            "".join(map(str, p)) if all(r < 10 for r in p) else ".".join(map(str, p)): c
            for p, c in counts.most_common(64)
        },
        "tk": None if tk is None else {"path": args.tk, "ms": tk},
    }
    command = shlex.join(
        ["python", "experiments/trees/tree_ceiling.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(result, args.out, args.name, command, markdown)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
