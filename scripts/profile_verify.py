"""Cost of a k-token cached decoder step (the speculative verify call) relative to a 1-token step.

  python scripts/profile_verify.py --roofline --dots --rounds 25        # -> verify_cost.{json,md}
  python scripts/profile_verify.py --pin_cpu 1 --breakdown --dots --variants default,ynn_off \
      --tag pinned --rounds 20                                          # one core + per-op split
  python scripts/profile_verify.py --models tiny --ks 1,2 --rounds 2 --out /tmp/v   # smoke

All logic, options and outputs: `benchmarks/verify_cost.py` (`python scripts/profile_verify.py -h`).
Findings: results/verify_cost/README.md.
"""

import pathlib
import sys

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import verify_cost

if __name__ == "__main__":
    verify_cost.main()
