"""Autotune end to end: two real ranks train-like with HORO_AUTOTUNE=1 while rank 0 retunes the fusion
threshold and the allreduce crossover between steps.

Every rank must switch algorithm at the same response, or the ranks exchange different byte counts
and the values (or the job) break; so every step checks exact values. The gradient sizes straddle
the crossover candidates (1 KB to 768 KB, 1.2 MB fused), so that the algorithm of some responses changes with
every crossover and fusion threshold tried. HORO_CYCLE_TIME is set explicitly and must stay fixed.
A second test runs three ranks as threads over the loopback transport (recursive doubling then
folds a rank in and out), with the fusion threshold fixed and the cycle time tuned.
The C++ test test/cpp/test_autotune.cc covers the optimiser, the sampler and the chain in detail.
"""
import csv

import numpy as np
import pytest

import horo_runner
from horo_core import config
from horo_core import numpy_ops as ops
from loopback_world import World

# Float32 element counts of the "gradients": 1 KB, 16 KB, 128 KB, 320 KB and 768 KB.
GRADIENT_ELEMENTS = [256, 4096, 32768, 81920, 196608]
WARMUP_SAMPLES = 1
STEPS_PER_SAMPLE = 1
BAYES_SAMPLES = 6
CROSSOVER_VALUES = [65536, 0, 8192, 524288, 4194304]  # the default first, then the ladder
# Each sample takes 5 measurements of STEPS_PER_SAMPLE steps, plus up to two steps to restart the
# window after a change of parameters.
SAMPLES = WARMUP_SAMPLES + BAYES_SAMPLES + len(CROSSOVER_VALUES)
STEP_BOUND = SAMPLES * (5 * STEPS_PER_SAMPLE + 2)


def _train_like(steps):
    import torch

    import horo_torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = size * (size + 1) // 2
    failures = []
    grads = [torch.zeros(n) for n in GRADIENT_ELEMENTS]
    base = [torch.arange(n, dtype=torch.float32) % 7 + 1 for n in GRADIENT_ELEMENTS]
    for step in range(steps):
        factor = step % 5 + 1
        handles = []
        # Backward order: last layer first, as DistributedOptimizer's hooks would submit them.
        for i in reversed(range(len(grads))):
            grads[i].copy_(base[i] * factor * (rank + 1))
            handles.append((i, hvd.allreduce_async_(grads[i], name=f"grad.{i}", op=hvd.Sum)))
        gathered = hvd.allgather(torch.full((rank + 1, 2), float(step)), name="metrics")
        for i, h in handles:
            got = hvd.synchronize(h)
            if not torch.equal(got, base[i] * factor * total):
                failures.append(f"rank {rank} step {step} grad.{i}: {got[:4].tolist()}")
        want = torch.full((total, 2), float(step))
        if not torch.equal(gathered, want):
            failures.append(f"rank {rank} step {step} allgather: {gathered.flatten()[:6].tolist()}")
    hvd.shutdown()
    return failures


def test_autotune_tunes_during_training_and_keeps_values_exact(tmp_path):
    log = tmp_path / "autotune.csv"
    env = {
        "HORO_AUTOTUNE": "1",
        "HORO_AUTOTUNE_LOG": str(log),
        "HORO_AUTOTUNE_WARMUP_SAMPLES": str(WARMUP_SAMPLES),
        "HORO_AUTOTUNE_STEPS_PER_SAMPLE": str(STEPS_PER_SAMPLE),
        "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(BAYES_SAMPLES),
        # Set explicitly (to the default), so it must stay fixed.
        "HORO_CYCLE_TIME": "0",
    }
    failures = horo_runner.run(_train_like, args=(STEP_BOUND,), num_proc=2, env=env)
    assert failures == [[], []]

    rows = _read_log(log)
    assert rows[0] == ["sample", "cycle_time_ms", "tensor_fusion_threshold", "small_message_bytes", "score"]
    samples, best = rows[1:-1], rows[-1]
    # Tuning ended within STEP_BOUND steps: every sample was logged, then the chosen setting.
    assert [r[0] for r in samples] == [str(i) for i in range(1, BAYES_SAMPLES + len(CROSSOVER_VALUES) + 1)]
    assert best[0] == "best", rows
    assert all(float(r[4]) > 0 for r in samples), samples
    # The explicitly set cycle time never moved.
    assert {r[1] for r in rows[1:]} == {"0"}, rows
    # The fusion threshold moved during the joint stage, starting from the 64 MiB default.
    fusion = [float(r[2]) for r in samples[:BAYES_SAMPLES]]
    assert fusion[0] == 64.0 and len(set(fusion)) == BAYES_SAMPLES, fusion
    # The crossover stage tried every candidate with the chosen fusion threshold.
    crossover = samples[BAYES_SAMPLES:]
    assert [int(r[3]) for r in crossover] == CROSSOVER_VALUES, crossover
    assert len({r[2] for r in crossover}) == 1, crossover
    # The chosen setting is one that was measured, with the score measured there.
    assert (best[1], best[2], best[3], best[4]) in {(r[1], r[2], r[3], r[4]) for r in crossover}, rows


def _read_log(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_autotune_loopback_three_ranks_tunes_cycle_time_with_fusion_fixed(monkeypatch, tmp_path):
    log = tmp_path / "loopback.csv"
    for key, value in {"HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": str(log), "HORO_AUTOTUNE_WARMUP_SAMPLES": "0",
                       "HORO_AUTOTUNE_STEPS_PER_SAMPLE": "1", "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "5",
                       "HOROVOD_FUSION_THRESHOLD": str(1 << 20)}.items():
        monkeypatch.setenv(key, value)
    samples = 5 + len(CROSSOVER_VALUES)
    steps = samples * (5 * 1 + 2)

    def body(rt):
        total = 6  # 1 + 2 + 3
        bad = []
        for step in range(steps):
            arrays = [np.full(n, float(rt.rank + 1 + step % 3), dtype=np.float32) for n in GRADIENT_ELEMENTS]
            outs = ops.grouped_allreduce(rt, arrays, [f"g.{i}" for i in range(len(arrays))])
            want = total + 3 * (step % 3)
            bad += [f"rank {rt.rank} step {step} g.{i}" for i, o in enumerate(outs) if not np.all(o == want)]
        return bad

    with World(3) as world:
        assert world.run(body, timeout=300) == [[], [], []]
    rows = _read_log(log)
    assert rows[-1][0] == "best" and len(rows) == 1 + samples + 1, rows
    assert {r[2] for r in rows[1:]} == {"1"}, rows  # HOROVOD_FUSION_THRESHOLD (1 MiB) held fixed
    cycle = [float(r[1]) for r in rows[1:6]]
    assert cycle[0] == 0.0 and len(set(cycle)) == 5, cycle
    assert [int(r[3]) for r in rows[6:-1]] == CROSSOVER_VALUES, rows


@pytest.mark.parametrize("variable, value, message", [
    ("HORO_AUTOTUNE_STEPS_PER_SAMPLE", "0", "HORO_AUTOTUNE_STEPS_PER_SAMPLE must be >= 1, got 0"),
    ("HORO_AUTOTUNE_WARMUP_SAMPLES", "-1", "HORO_AUTOTUNE_WARMUP_SAMPLES must be >= 0, got -1"),
    ("HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0", "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES must be >= 1, got 0"),
    # The variable the user set is the one named, Horovod's name included.
    ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1.5", "^HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE must be between 0 and 1, got 1.5"),
    ("HORO_AUTOTUNE", "maybe", "HORO_AUTOTUNE='maybe' is not a valid bool"),
])
def test_invalid_autotune_settings_are_named(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message):
        config.settings()


@pytest.mark.parametrize("text, expected", [("2", "1"), ("00", "0"), ("Yes", "1"), ("off", "0")])
def test_boolean_settings_read_any_integer_as_horovod_does(monkeypatch, text, expected):
    # Horovod reads them with strtol: HOROVOD_AUTOTUNE=2 turns autotune on, and so does
    # HOROVOD_HIERARCHICAL_ALLREDUCE=2 hierarchical allreduce (Horo's "auto" aside).
    monkeypatch.setenv("HOROVOD_AUTOTUNE", text)
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", text)
    assert (config.value("AUTOTUNE"), config.value("HIERARCHICAL_ALLREDUCE")) == (expected, expected)


def test_hororun_autotune_flags_become_settings():
    from horo_runner.launch import parse_args, settings_env

    env = settings_env(parse_args([
        "-np", "2", "--autotune", "--autotune-log-file", "/tmp/at.csv", "--autotune-warmup-samples", "0",
        "--autotune-steps-per-sample", "4", "--autotune-bayes-opt-max-samples", "8",
        "--autotune-gaussian-process-noise", "0.5", "python", "train.py"]))
    assert {k: v for k, v in env.items() if "AUTOTUNE" in k} == {
        "HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": "/tmp/at.csv", "HORO_AUTOTUNE_WARMUP_SAMPLES": "0",
        "HORO_AUTOTUNE_STEPS_PER_SAMPLE": "4", "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "8",
        "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5"}
    plain = settings_env(parse_args(["-np", "2", "python", "train.py"]))
    assert not any("AUTOTUNE" in k for k in plain)
