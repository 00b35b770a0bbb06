"""Cost of a k-token cached decoder step (the speculative verify call) relative to a 1-token step.

  python scripts/profile_verify.py --roofline --dots --rounds 25        # -> verify_cost.{json,md}
  python scripts/profile_verify.py --pin_cpu 1 --breakdown --dots --variants default,ynn_off \
      --tag pinned --rounds 20                                          # one core + per-op split
  python scripts/profile_verify.py --models tiny --ks 1,2 --rounds 2 --out /tmp/v   # smoke

All logic, options and outputs: `specdec_t5x/bench/verify_cost.py` (`python scripts/profile_verify.py -h`).
Findings: results/verify_cost/README.md.
"""

from specdec_t5x.bench import verify_cost

if __name__ == "__main__":
    verify_cost.main()
