"""The one-sentence decode CLI: input and output, tokens per target call, time, the baseline at
T = 0, length buckets, empty texts and one-line errors."""

import jax
import pytest

from specdec_t5x import decode

GIN = "--gin_file=gin/experiments/embedded_ende_source_copy_t0.gin"
# 18 and 27 tokens, EOS included: past INPUT_LEN = 8, both in its bucket of 32 tokens.
LONGER = (
    "translate English to German: Documentation for the command-line tools of the image viewer."
)
LONGEST = (
    "translate English to German: This package contains the documentation for the command-line "
    "tools of the GNU image manipulation program and its plugins."
)


def test_decode_prints_each_input_beside_its_output_and_the_identical_baseline(capsys, monkeypatch):
    compiles = []

    def on_compile(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    per_call, timed_twice = [], decode._timed_twice

    def counted(fn, *args):  # compilations per decode (speculative, then baseline)
        before = len(compiles)
        out = timed_twice(fn, *args)
        per_call.append(len(compiles) - before)
        return out

    monkeypatch.setattr(decode, "_timed_twice", counted)
    argv = [GIN, "--gin.TARGET_LEN=16", "--gin.GAMMA=3", "--gin.INPUT_LEN=8", LONGER, " ", LONGEST]
    jax.monitoring.register_event_duration_secs_listener(on_compile)
    try:
        records = decode.main(argv)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert [r["input"] for r in records] == [LONGER, LONGEST]  # the empty text skipped
    for record in records:
        assert record["output"] and record["baseline"]["identical"]
        assert record["output"] == record["baseline"]["output"]
        assert 1.0 <= record["tokens_per_target_call"] <= 4.0 and record["ms"] > 0
    # A text of another length in the same bucket runs the programs already compiled.
    assert per_call[0] > 0 and per_call[2:] == [0, 0], per_call
    printed = capsys.readouterr()
    assert f"input 1 of 3 (18 tokens): {LONGER}\nspeculative (γ = 3, T = 0): " in printed.out
    assert f"input 3 of 3 (27 tokens): {LONGEST}\n" in printed.out
    assert "per target call" in printed.out and "identical: True" in printed.out
    assert printed.err.count("warning: text 2 of 3 is empty; skipped.") == 1


def test_inputs_pad_to_input_len_then_to_its_doublings():
    assert [decode.input_width(n, 64) for n in (1, 64, 65, 128, 129, 200)] == [
        64, 64, 128, 128, 256, 256,
    ]  # fmt: skip


def test_decode_usage_and_errors(capsys):
    assert decode.main(["--help"]) is None and "usage:" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least one text"):
        decode.main([GIN])
    with pytest.raises(ValueError, match="unknown flag"):
        decode.main([GIN, "--fast", "text"])
    with pytest.raises(ValueError, match="fixed GAMMA >= 1"):
        decode.main([GIN, "--gin.GAMMA='auto'", "text"])
    with pytest.raises(ValueError, match=r"every text given is empty \(2\); nothing to decode"):
        decode.main([GIN, "", "  "])
    capsys.readouterr()
    # On the command line: one line naming what was wrong, exit status 1.
    with pytest.raises(SystemExit) as exit_:
        decode.run([GIN, "--fast", "text"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: unknown flag(s) --fast; expected --gin_file=FILE [--gin.KEY=VALUE ...] and at "
        "least one text."
    ]
