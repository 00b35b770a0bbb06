"""Summarise this experiment's T5X runs from their logs and outputs (run after run.sh's runs).

  python summarize.py [RUNSET, default xb2]   -> results/runs.json, results/runs.csv, results/comparisons.json,
                           results/aux_stats.json (stdout: the table)

Per run (log /work/t5x_run/logs/<RUNSET>_<name>.log, output /work/t5x_run/out/<RUNSET>_<name>/): the command
and switches run.sh recorded, uptime before/after, whole-process wall seconds, and from T5X's and
JAX's own log lines (JAX_LOG_COMPILES=1): the trace + lowering + XLA compile seconds of
jit(infer_step_with_indices) (the decode T5X jits), "chunk completed in" (infer.py: everything after
the dataset is loaded, compilation included) and the seconds from the end of that compilation to
"chunk completed" (infer.py) / "Computing metrics for" (eval.py): decode with compilation
separated out. BLEU from eval.py's inference_eval/ddtp_ende-metrics.jsonl. Comparisons are
token-level where both infer runs wrote ids (gin/output_ids.gin). Aux statistics from the
predict_with_aux runs (SpeculativeStats per example).
"""
import csv
import datetime as dt
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from compare import compare  # noqa: E402

LOGS, OUT = "/work/t5x_run/logs", "/work/t5x_run/out"
RS = sys.argv[1] if len(sys.argv) > 1 else "xb2"
HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (model, T, devices, kernel, dtype/batch, baseline infer run to compare against)
RUNS = {
    "infer_base_t0": ("baseline", 0, 1, "-", "float32/4", None),
    "eval_base_t0": ("baseline", 0, 1, "-", "float32/4", None),
    "infer_spec_t0_koff": ("speculative", 0, 1, "off", "float32/4", "infer_base_t0"),
    "eval_spec_t0_koff": ("speculative", 0, 1, "off", "float32/4", "eval_base_t0"),
    "infer_spec_t0_kon": ("speculative", 0, 1, "on", "float32/4", "infer_base_t0"),
    "eval_spec_t0_kon": ("speculative", 0, 1, "on", "float32/4", "eval_base_t0"),
    "infer_spec_t0_kon_aux": ("speculative", 0, 1, "on", "float32/4", "infer_base_t0"),
    "infer_base_t1": ("baseline", 1, 1, "-", "float32/4", None),
    "eval_base_t1": ("baseline", 1, 1, "-", "float32/4", None),
    "infer_spec_t1": ("speculative", 1, 1, "on", "float32/4", "infer_base_t1"),
    "eval_spec_t1": ("speculative", 1, 1, "on", "float32/4", "eval_base_t1"),
    "infer_spec_t1_aux": ("speculative", 1, 1, "on", "float32/4", "infer_spec_t1"),
    "infer_base_t0_2dev": ("baseline", 0, 2, "-", "float32/4", "infer_base_t0"),
    "eval_base_t0_2dev": ("baseline", 0, 2, "-", "float32/4", "eval_base_t0"),
    "infer_spec_t0_koff_2dev": ("speculative", 0, 2, "off", "float32/4", "infer_base_t0"),
    "eval_spec_t0_koff_2dev": ("speculative", 0, 2, "off", "float32/4", "eval_base_t0"),
    "infer_spec_t0_kon_2dev": ("speculative", 0, 2, "default (falls back: sharded)", "float32/4",
                               "infer_base_t0"),
    "infer_base_t0_bf16_b32": ("baseline", 0, 1, "-", "bf16 weights, f32 act/32", "infer_base_t0"),
    "eval_base_t0_bf16_b32": ("baseline", 0, 1, "-", "bf16 weights, f32 act/32", "eval_base_t0"),
    "infer_spec_t0_bf16_b32_aux": ("speculative", 0, 1, "on", "bf16 weights, f32 act/32",
                                   "infer_base_t0_bf16_b32"),
    "eval_spec_t0_bf16_b32": ("speculative", 0, 1, "on", "bf16 weights, f32 act/32",
                              "eval_base_t0_bf16_b32"),
    "infer_base_t0_bf16act_b32": ("baseline", 0, 1, "-", "bf16 weights+act/32", "infer_base_t0"),
    "eval_base_t0_bf16act_b32": ("baseline", 0, 1, "-", "bf16 weights+act/32", "eval_base_t0"),
    "infer_spec_t0_bf16act_b32_aux": ("speculative", 0, 1, "default (falls back: bf16 act)",
                                      "bf16 weights+act/32", "infer_base_t0_bf16act_b32"),
    "eval_spec_t0_bf16act_b32": ("speculative", 0, 1, "default (falls back: bf16 act)",
                                 "bf16 weights+act/32", "eval_base_t0_bf16act_b32"),
}
for _i in (1, 2):  # wall-clock repeats (runs_all.sh, part f), interleaved
    RUNS[f"timing_base_r{_i}"] = ("baseline", 0, 1, "-", "float32/4", "infer_base_t0")
    RUNS[f"timing_spec_koff_r{_i}"] = ("speculative", 0, 1, "off", "float32/4", "infer_base_t0")
    RUNS[f"timing_spec_kon_r{_i}"] = ("speculative", 0, 1, "on", "float32/4", "infer_base_t0")
TS = re.compile(r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d+) ")


def ts(line):
    m = TS.match(line)
    return None if m is None else dt.datetime.strptime(m.group(2), "%H:%M:%S.%f")


def parse_log(name):
    lines = open(f"{LOGS}/{RS}_{name}.log").read().splitlines()
    r = {"log": f"{LOGS}/{RS}_{name}.log"}
    for ln in lines:
        if ln.startswith("# start "):
            r["start_utc"] = ln.split()[2]
            r["switches"] = " ".join(ln.split()[3:])
        elif ln.startswith("# uptime before:"):
            r["load_before"] = ln.split("load average:")[1].strip()
        elif ln.startswith("# uptime after:"):
            r["load_after"] = ln.split("load average:")[1].strip()
        elif ln.startswith("# cd "):
            r["command"] = ln[2:]
        elif ln.startswith("# wall seconds"):
            r["process_wall_s"] = round(float(ln.split(":")[1]), 2)
        elif ln.startswith("# project:"):
            r["project_commit"], _, r["git_status"] = ln[len("# project: "):].partition(" status: ")
        elif ln.startswith("# library sources sha256:"):
            r["library_sha256"] = ln.split(":")[1].strip()
        elif ln.startswith("# kernel extension sha256:"):
            r["extension_sha256"] = ln.split(":")[1].strip()
        elif ln.startswith("# exit status"):
            r["exit_status"] = int(ln.split(":")[1])
    comp, comp_end, end = 0.0, None, None
    for ln in lines:
        m = re.search(r"Finished (tracing infer_step_with_indices for jit|jaxpr to MLIR module "
                      r"conversion jit\(infer_step_with_indices\)|XLA compilation of "
                      r"jit\(infer_step_with_indices\)) in ([0-9.]+) sec", ln)
        if m:
            comp += float(m.group(2))
            if "XLA compilation" in ln:
                comp_end = ts(ln)
        m = re.search(r"chunk completed in ([0-9.]+) seconds", ln)
        if m:
            r["chunk_completed_s"] = round(float(m.group(1)), 2)
            end = ts(ln)
        if "Computing metrics for" in ln and end is None:
            end = ts(ln)
    r["infer_step_compile_s"] = round(comp, 2)
    r["infer_step_compilations"] = sum("Finished XLA compilation of jit(infer_step_with_indices)"
                                       in ln for ln in lines)
    if comp_end and end:
        r["after_compile_s"] = round((end - comp_end).total_seconds(), 2)
    r["kernel_fallback"] = [ln.split("] ", 1)[1] for ln in lines if "CPU matmul kernel not used" in ln]
    mesh = set(re.findall(r"Mesh\('data': \d+, 'model': \d+", "\n".join(lines)))
    r["mesh"] = sorted(m.replace("Mesh(", "{") + "}" for m in mesh)
    return r


def eval_preds(name):
    return [json.loads(l)["prediction"] for l in
            open(glob.glob(f"{OUT}/{RS}_{name}/inference_eval/ddtp_ende-*[0-9].jsonl")[0])]


def aux_summary(name, batch):
    (path,) = glob.glob(f"{OUT}/{RS}_{name}/*-predict_with_aux.jsonl-00000-of-00001")
    rows = [json.loads(l) for l in open(path)]
    s = {k: [r["aux"]["stats"][k] for r in rows] for k in rows[0]["aux"]["stats"]}
    it, gen = sum(s["num_iterations"]), sum(s["num_generated"])
    groups = [range(i, min(i + batch, len(rows))) for i in range(0, len(rows), batch)]
    # The loop runs a batch until its last row ends: a batch pays max(iterations) target calls;
    # T5X's temperature_sample pays max(num_generated) one-token steps for the same batch.
    batch_calls = sum(max(s["num_iterations"][i] for i in g) for g in groups)
    baseline_steps = sum(max(s["num_generated"][i] for i in g) for g in groups)
    hist = [sum(h[j] for h in s["accept_histogram"]) for j in range(len(s["accept_histogram"][0]))]
    return {
        "run": name, "examples": len(rows), "batch": batch,
        "sum_num_iterations (target calls, per row)": it,
        "sum_num_generated": gen,
        "tokens_per_target_call (sum generated / sum iterations, per row)": round(gen / it, 4),
        "batched target calls (sum over batches of max iterations)": batch_calls,
        "baseline one-token steps for the same batches (sum of max num_generated)": baseline_steps,
        "batch-level target-call ratio (baseline steps / speculative calls)":
            round(baseline_steps / batch_calls, 4),
        "alpha_counted (sum accepted / sum draft tokens tested)":
            round(sum(s["num_accepted"]) / sum(s["num_draft_tokens"]), 4),
        "alpha_beta (sum beta / num beta, Corollary 3.6)":
            round(sum(s["beta_sum"]) / sum(s["num_beta"]), 4),
        "sum_num_accepted": sum(s["num_accepted"]), "sum_num_draft_tokens": sum(s["num_draft_tokens"]),
        "sum_num_proposed": sum(s["num_proposed"]),
        "accept_histogram (iterations accepting n = 0..gamma drafts)": hist,
        "scores: all zero": all(r["aux"]["scores"] == 0 for r in rows),
        "scores: mean": sum(r["aux"]["scores"] for r in rows) / len(rows),
    }


def main():
    runs, comps = [], []
    for name, (model, temp, dev, kernel, dtb, ref) in RUNS.items():
        if not os.path.exists(f"{LOGS}/{RS}_{name}.log"):
            print("no run", name)
            continue
        r = {"run": name, "binary": name.split("_")[0], "model": model, "T": temp, "devices": dev,
             "kernel": kernel, "dtype/batch": dtb, **parse_log(name)}
        if name.startswith("timing_"):
            r["binary"] = "infer"
        mfile = glob.glob(f"{OUT}/{RS}_{name}/inference_eval/ddtp_ende-metrics.jsonl")
        if mfile:
            r["bleu"] = json.loads(open(mfile[0]).read().splitlines()[-1])["bleu"]
        if ref is not None:
            if r["binary"] == "infer":
                c = compare(f"{OUT}/{RS}_{ref}", f"{OUT}/{RS}_{name}")
                r["vs"], r["identical"] = ref, f"{c['identical']}/{c['n']} ({c['compared']})"
                comps.append({"run": name, "vs": ref, "n": c["n"], "compared": c["compared"],
                              "identical": c["identical"], "identical_strings": c["identical_strings"],
                              "differing": [{k: d[k] for k in ("example", "first_diff_token",
                                             "a_token", "b_token") if k in d}
                                            for d in c["differing"]]})
            else:
                a, b = eval_preds(ref), eval_preds(name)
                same = sum(x == y for x, y in zip(a, b))
                r["vs"], r["identical"] = ref, f"{same}/{len(a)} (strings)"
                comps.append({"run": name, "vs": ref, "n": len(a), "compared": "strings",
                              "identical_strings": same})
        runs.append(r)
    aux = [aux_summary(n, b) for n, b in [("infer_spec_t0_kon_aux", 4), ("infer_spec_t1_aux", 4),
                                          ("infer_spec_t0_bf16_b32_aux", 32),
                                          ("infer_spec_t0_bf16act_b32_aux", 32)]]
    # Wall-clock of the T = 0, 1-device, float32, batch 4 infer.py runs (same decode), by variant.
    groups = {"baseline": ["infer_base_t0", "timing_base_r1", "timing_base_r2"],
              "speculative, kernel off": ["infer_spec_t0_koff", "timing_spec_koff_r1",
                                          "timing_spec_koff_r2"],
              "speculative, kernel on": ["infer_spec_t0_kon", "infer_spec_t0_kon_aux",
                                         "timing_spec_kon_r1", "timing_spec_kon_r2"]}
    by = {r["run"]: r for r in runs}
    wall = {}
    for g, names in groups.items():
        rs = [by[n] for n in names if n in by]
        wall[g] = {k: [r.get(k) for r in rs] for k in
                   ("run", "infer_step_compile_s", "after_compile_s", "chunk_completed_s",
                    "process_wall_s", "load_before")}
        for k in ("infer_step_compile_s", "after_compile_s", "chunk_completed_s"):
            v = sorted(x for x in wall[g][k] if x is not None)
            if v:
                wall[g][k + " median"] = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    os.makedirs(f"{HERE}/results", exist_ok=True)
    pre = "" if RS == "xb2" else f"{RS}_"
    json.dump(runs, open(f"{HERE}/results/{pre}runs.json", "w"), indent=1)
    json.dump(comps, open(f"{HERE}/results/{pre}comparisons.json", "w"), indent=1)
    json.dump(aux, open(f"{HERE}/results/{pre}aux_stats.json", "w"), indent=1)
    json.dump(wall, open(f"{HERE}/results/{pre}wall_clock.json", "w"), indent=1)
    cols = ["run", "model", "T", "devices", "kernel", "dtype/batch", "vs", "identical", "bleu",
            "infer_step_compile_s", "after_compile_s", "chunk_completed_s", "process_wall_s",
            "load_before", "load_after", "start_utc", "exit_status"]
    with open(f"{HERE}/results/{pre}runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(runs)
    for r in runs:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print(json.dumps(aux, indent=1))


if __name__ == "__main__":
    main()
