"""Compare two infer.py outputs (jsonl from T5X's write_inferences_to_file) example by example.

  python compare.py <infer out dir A> <infer out dir B>   -> JSON on stdout

Reports how many predictions are identical as strings and (when both have 'prediction_tokens',
gin/output_ids.gin) as token ids, and for each differing example the index of the first
differing token. Examples are matched by line order and checked to have the same input.
"""
import glob
import json
import sys


def load(d):
    (path,) = glob.glob(f"{d}/*-predict*.jsonl-00000-of-00001")
    return [json.loads(line) for line in open(path)]


def compare(a_dir, b_dir):
    a, b = load(a_dir), load(b_dir)
    assert len(a) == len(b), (len(a), len(b))
    assert all(x["inputs"] == y["inputs"] for x, y in zip(a, b)), "inputs differ: not the same examples"
    tokens = all("prediction_tokens" in r for r in a + b)
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if tokens and x["prediction_tokens"] != y["prediction_tokens"]:
            s, t = x["prediction_tokens"], y["prediction_tokens"]
            j = next((k for k in range(min(len(s), len(t))) if s[k] != t[k]), min(len(s), len(t)))
            diffs.append({"example": i, "first_diff_token": j, "a_token": s[j] if j < len(s) else None,
                          "b_token": t[j] if j < len(t) else None,
                          "a": x["prediction"], "b": y["prediction"]})
        elif not tokens and x["prediction"] != y["prediction"]:
            diffs.append({"example": i, "a": x["prediction"], "b": y["prediction"]})
    return {"a": a_dir, "b": b_dir, "n": len(a), "compared": "tokens" if tokens else "strings",
            "identical": len(a) - len(diffs),
            "identical_strings": sum(x["prediction"] == y["prediction"] for x, y in zip(a, b)),
            "differing": diffs}


if __name__ == "__main__":
    print(json.dumps(compare(sys.argv[1], sys.argv[2]), indent=1, ensure_ascii=False))
