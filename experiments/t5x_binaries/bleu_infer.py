"""BLEU (the task's metric, specdec_t5x.metrics.bleu) of infer.py outputs against their
targets_pretokenized: for the T = 1 runs, more samples of each sampler than eval.py's one.

  python bleu_infer.py <infer out dir> ...   -> JSON {dir: bleu}
"""
import glob
import json
import sys

from specdec_t5x import metrics

out = {}
for d in sys.argv[1:]:
    (path,) = glob.glob(f"{d}/*-predict*.jsonl-00000-of-00001")
    rows = [json.loads(line) for line in open(path)]
    out[d] = metrics.bleu([r["inputs"]["targets_pretokenized"] for r in rows],
                          [r["prediction"] for r in rows])["bleu"]
print(json.dumps(out, indent=1))
