"""The TensorFlow examples run under ``hororun -np 2`` and verify their own results."""
import os
import re
import subprocess
import sys

import pytest

from tf_checks import CHILD_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_", "TF_CONFIG"))}
    env.update(CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    script = os.path.join(ROOT, "examples", "tensorflow", name)
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "2", sys.executable, script, *args],
                          env=env, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_keras_digits_reaches_95_percent():
    pytest.importorskip("sklearn", reason="the digits example reads scikit-learn's bundled data set")
    out = run_example("keras_digits.py", "--epochs", "20")
    match = re.search(r"\[0\]<stdout>:test accuracy: ([0-9.]+) \(360 images, 2 ranks\)", out)
    assert match, out[-3000:]
    assert float(match.group(1)) >= 0.95
    assert "finished gradual learning rate warmup" in out


def test_tf1_session_digits_trains_and_resumes(tmp_path):
    """Horovod's TF1 script shape (DistributedOptimizer of a tf.compat.v1.train optimizer,
    BroadcastGlobalVariablesHook, MonitoredTrainingSession): a run that stops at step 100, and one
    that resumes from rank 0's checkpoint there and reaches 95% test accuracy."""
    pytest.importorskip("sklearn", reason="the digits example reads scikit-learn's bundled data set")
    checkpoints = str(tmp_path / "checkpoints")
    first = run_example("tensorflow1_digits.py", "--steps", "200", "--checkpoint-dir", checkpoints,
                        "--min-accuracy", "0")
    assert "[0]<stdout>:step 100:" in first, first[-3000:]
    second = run_example("tensorflow1_digits.py", "--steps", "600", "--checkpoint-dir", checkpoints)
    assert "[0]<stdout>:step 100:" not in second and "[0]<stdout>:step 300:" in second, second[-3000:]
    match = re.search(r"\[0\]<stdout>:test accuracy \(mean over 2 ranks' shards\): ([0-9.]+)", second)
    assert match, second[-3000:]
    assert float(match.group(1)) >= 0.95


def test_synthetic_benchmark_three_modes():
    out = run_example("tensorflow2_synthetic_benchmark.py", "--num-iters", "3", "--num-batches-per-iter", "2",
                      "--num-warmup-batches", "1")
    for mode in ("local", "horo"):
        assert re.search(rf"\[0\]<stdout>:{mode} +\| +[0-9.]+ ms \| +[0-9.]+ \| +[0-9.]+ \| [+-][0-9.]+ ms", out), \
            out[-3000:]
    assert len(re.findall(r"\[0\]<stdout>:Repeat #[0-2]: ", out)) == 3, out[-3000:]
    mwms = re.search(r"\[0\]<stdout>:(?:Overhead horo / mwms: (?:-?[0-9.]+|n/a)"
                     r"|mwms: MultiWorkerMirroredStrategy cannot run here \(.+?\); no comparison with it\.)", out, re.S)
    assert mwms, out[-3000:]
