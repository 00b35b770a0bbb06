"""The eval job with auto γ's calibration rounds set to ROUNDS (env, default 0): its cost curve is
the measured one, unscaled by calls on the first sentence. Same flags as `python -m specdec_t5x.eval`.

  ROUNDS=0 python experiments/auto_calibration/eval_without_calibration.py --gin_file=... [...]
"""

import os

from specdec_t5x.auto import auto_gamma
from specdec_t5x.eval import cli

auto_gamma.AutoGammaDecoder.__init__.__kwdefaults__["calibration_rounds"] = int(
    os.environ.get("ROUNDS", "0")
)

if __name__ == "__main__":
    cli.run()
