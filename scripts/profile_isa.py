"""The CPU kernel's code paths side by side (AVX2 + FMA, AVX-512, an earlier build, XLA's dot).

  python scripts/profile_isa.py --before /path/to/earlier/_matmul.so --rounds 15 \
      --variants xla,kernel@avx2+fma,kernel_before@avx2+fma,kernel@avx512f
  python scripts/profile_isa.py --models tiny --dot_models tiny --ks 1,2 --rounds 2 --dot_rounds 2 \
      --out /tmp/isa   # smoke

All logic, options and outputs: `specdec_t5x/bench/isa_paths.py` (`python scripts/profile_isa.py -h`).
Findings: results/verify_cost/avx2/README.md.
"""

from specdec_t5x.bench import isa_paths

if __name__ == "__main__":
    isa_paths.main()
