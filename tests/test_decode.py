"""The one-sentence decode CLI: output, tokens per target call, time, and the baseline at T = 0."""

import pytest

from specdec_t5x import decode

GIN = "--gin_file=gin/experiments/embedded_ende_source_copy_t0.gin"


def test_decode_prints_the_output_and_the_identical_baseline(capsys):
    text = "translate English to German: This package contains the documentation."
    (record,) = decode.main([GIN, "--gin.TARGET_LEN=16", "--gin.GAMMA=3", text])
    assert record["input"] == text and record["output"]
    assert record["baseline"]["identical"] and record["output"] == record["baseline"]["output"]
    assert 1.0 <= record["tokens_per_target_call"] <= 4.0 and record["ms"] > 0
    printed = capsys.readouterr().out
    assert "per target call" in printed and "identical: True" in printed


def test_decode_usage_and_errors(capsys):
    assert decode.main(["--help"]) is None and "usage:" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least one text"):
        decode.main([GIN])
    with pytest.raises(ValueError, match="unknown flag"):
        decode.main([GIN, "--fast", "text"])
    with pytest.raises(ValueError, match="fixed GAMMA >= 1"):
        decode.main([GIN, "--gin.GAMMA='auto'", "text"])
