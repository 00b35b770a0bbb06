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
