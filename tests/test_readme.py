"""The README's Python example runs as pasted, and says what it returns."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_calling_example_runs_and_matches_greedy(tmp_path):
    code = _readme_block("## Calling it from your own T5X-shaped code")
    # The README's claim, checked in the same process: equal to greedy temperature_sample.
    check = """
from specdec_t5x import models as _models
_base = _models.EncoderDecoderModel(model.module, vocab, vocab)
_greedy = _base.predict_batch(params, batch, decoder_params={"temperature": 0.0})
assert decodes.shape == (len(sources), 64) and str(decodes.dtype) == "int32", decodes.shape
assert (decodes == _greedy).all(), (decodes, _greedy)
assert int(aux["stats"].num_iterations[0]) >= 1
print("README-OK")
"""
    script = tmp_path / "example.py"
    script.write_text(code + check)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "README-OK" in out.stdout


def test_t5x_lines_are_the_lines_the_t5x_binaries_ran():
    """The README's lines for T5X's binaries are those of the recorded run (experiments/
    t5x_binaries/gin), the draft checkpoint's path aside; the files they include ship."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Under T5X's own infer.py and eval.py") :]
    shown = re.search(r"```gin\n(.*?)```", section, re.S).group(1).strip().splitlines()
    key = lambda line: line.split("=")[0].strip() if line.startswith("DRAFT_CHECKPOINT") else line  # noqa: E731
    for name in ("speculative_infer.gin", "speculative_eval.gin"):
        lines = (ROOT / "experiments" / "t5x_binaries" / "gin" / name).read_text().splitlines()
        used = [line for line in lines if line.strip() and not line.startswith("#")]
        used = [line for line in used if not line.startswith("include 'baseline_")]
        assert [key(line) for line in shown] == [key(line) for line in used], name
    for line in shown:
        if line.startswith("include "):
            assert (ROOT / "specdec_t5x" / line.split("'")[1]).is_file(), line
