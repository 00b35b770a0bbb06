"""One-off: re-renders the committed flat-schema `metrics.json` files into the grouped schema.

    PYTHONPATH=. python experiments/metrics_schema/regroup.py          # rewrites them in place

Each flat record (written before `summary.group` existed: no `speed` group) is regrouped from its
own keys with `summary.group`, written as the eval job writes `metrics.json` (`outputs`: indent 2,
`default=float`, trailing newline). Refuses a file whose flat view would change (`summary.flat`
of the regrouped record must equal the flat record, keys lifted from `diagnostics` aside).
"""

import json
import pathlib
import sys

from specdec_t5x.eval import summary

ROOT = pathlib.Path(__file__).resolve().parents[2]


def flat_files() -> list[pathlib.Path]:
    files = sorted((ROOT / "results").rglob("metrics.json"))
    files += sorted((ROOT / "experiments").rglob("metrics.json"))
    out = []
    for f in files:
        record = json.loads(f.read_text())
        if "speedup" in record and not isinstance(record.get("speed"), dict):
            out.append(f)
    return out


def regroup(record: dict) -> dict:
    grouped = summary.group(record)
    view = summary.flat(grouped)
    lifted = {"time_budget"} - set(record)  # flat() lifts it from diagnostics
    if {k: v for k, v in view.items() if k not in lifted} != record:
        raise ValueError("the flat view changed")
    return grouped


def main() -> None:
    files = flat_files()
    for f in files:
        grouped = regroup(json.loads(f.read_text()))
        f.write_text(json.dumps(grouped, indent=2, default=float) + "\n")
    print(f"regrouped {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
