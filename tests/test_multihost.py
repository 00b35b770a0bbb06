"""Multi-host eval: 2 CPU processes on 127.0.0.1 give the metrics of a single-process run."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import init_params, perturbed, tiny_config
from test_eval import configs

from specdec_t5x import drafts, models, multihost, network, vocab
from specdec_t5x.eval import job, summary

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = dict(  # only the deterministic metrics are compared
    gamma=2,
    temperature=1.0,
    num_examples=4,
    input_len=32,
    target_len=8,
    cost_repeats=2,
)
DETERMINISTIC = (
    "alpha_beta alpha_counted tokens_per_iteration target_calls baseline_target_calls "
    "accept_histogram identical_fraction quality num_examples"
).split()

WORKER = """
import json, sys
sys.path.insert(0, {tests!r})
from conftest import init_params, perturbed, tiny_config
from test_eval import configs
from specdec_t5x import multihost
multihost.initialize('127.0.0.1:{port}', 2, {pid})
from specdec_t5x import drafts, models, network, vocab
from specdec_t5x.eval import job
from test_eval import configs
vocabulary = vocab.get_vocabulary()
module = network.Transformer(tiny_config(vocab_size=vocab.model_vocab_size(vocabulary)))
params = init_params(module, 3)
draft = drafts.T5Draft(module, perturbed(params, 0.05, 4))
spec = models.SpeculativeEncoderDecoderModel(module, draft, vocabulary, vocabulary)
job.evaluate(spec, params, {out!r}, **configs(**{settings!r}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_give_single_process_metrics(data_dir, tmp_path):
    port, multi = _free_port(), tmp_path / "multi"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER.format(
                    tests=str(REPO / "tests"),
                    port=port,
                    pid=pid,
                    out=str(multi if pid == 0 else tmp_path / "unused"),
                    settings=SETTINGS,
                ),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in (0, 1)
    ]
    vocabulary = vocab.get_vocabulary()  # the single-process run meanwhile, in this process
    module = network.Transformer(tiny_config(vocab_size=vocab.model_vocab_size(vocabulary)))
    params = init_params(module, 3)
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 4))
    spec = models.SpeculativeEncoderDecoderModel(module, draft, vocabulary, vocabulary)
    single = summary.flat(
        job.evaluate(spec, params, str(tmp_path / "single"), **configs(**SETTINGS))
    )
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
    assert not (tmp_path / "unused" / "metrics.json").exists()  # only process 0 writes
    gathered = summary.flat(json.loads((multi / "metrics.json").read_text()))
    for key in DETERMINISTIC:
        assert gathered[key] == single[key], key
    for g, row in single["gamma_sweep"].items():
        for key in ("alpha_beta", "tokens_per_iteration", "accept_histogram", "quality"):
            assert gathered["gamma_sweep"][g][key] == row[key], (g, key)
    lines = lambda d: [json.loads(x) for x in (d / "predictions.jsonl").read_text().splitlines()]
    for a, b in zip(lines(multi), lines(tmp_path / "single"), strict=True):
        assert (a["baseline"], a["speculative"], a["stats"]) == (
            b["baseline"],
            b["speculative"],
            b["stats"],
        )


def test_single_process_gather_orders_examples_and_checks_ids():
    cols = {"tokens": [np.array([3]), np.array([1])], "stats": [None, None]}
    out = multihost.gather_examples(cols, [1, 0], 2)
    assert [int(x[0]) for x in out["tokens"]] == [1, 3] and out["stats"] == [None, None]
    assert multihost.local_batches(3) == [0, 1, 2]
    with pytest.raises(ValueError, match="not 0..2"):
        multihost.gather_examples({"tokens": [1, 2]}, [0, 2], 3)
    with pytest.raises(ValueError, match="process_id=2"):
        multihost.initialize("127.0.0.1:1", 2, 2)


def test_split_flags_takes_t5x_multiprocess_flags():
    argv = [
        "--gin_file=a.gin",
        "--coordinator_address=h:1",
        "--process_count=2",
        "--process_index=1",
    ]
    rest, kwargs = multihost.split_flags(argv)
    assert rest == ["--gin_file=a.gin"]
    assert kwargs == {"coordinator_address": "h:1", "num_processes": 2, "process_id": 1}
    assert multihost.split_flags(["--multiprocess"]) == (
        [],
        {"coordinator_address": None, "num_processes": None, "process_id": None},
    )
    assert multihost.split_flags(["--gin.X=1"]) == (["--gin.X=1"], None)
