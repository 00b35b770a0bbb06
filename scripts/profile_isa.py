"""The CPU kernel's code paths side by side (AVX2 + FMA, AVX-512, an earlier build, XLA's dot).

  python scripts/profile_isa.py --before /path/to/earlier/_matmul.so --rounds 15 \
      --variants xla,kernel@avx2+fma,kernel_before@avx2+fma,kernel@avx512f
  python scripts/profile_isa.py --models tiny --dot_models tiny --ks 1,2 --rounds 2 --dot_rounds 2 \
      --out /tmp/isa   # smoke

All logic, options and outputs: `benchmarks/isa_paths.py` (`python scripts/profile_isa.py -h`).
Findings: results/verify_cost/avx2/README.md.
"""

import pathlib
import sys

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import isa_paths

if __name__ == "__main__":
    isa_paths.main()
