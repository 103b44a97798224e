"""The training examples run under hororun, reach their accuracy and leave a checkpoint."""
import os
import re
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pytorch_digits_under_hororun(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    checkpoint = tmp_path / "digits" / "checkpoint.pt"
    example = os.path.join(ROOT, "examples", "pytorch", "pytorch_digits.py")
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "2", sys.executable, example,
                           "--checkpoint", str(checkpoint)], env=env, text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("[0]<stdout>:") for line in lines), "only rank 0 prints:\n" + proc.stdout
    assert sum(1 for line in lines if re.search(r"epoch \d+/20: test loss", line)) == 20
    match = re.search(r"^\[0\]<stdout>:final test accuracy: (\d\.\d{4}) on 450 samples, 2 ranks$", proc.stdout,
                      re.MULTILINE)
    assert match, proc.stdout
    accuracy = float(match.group(1))
    assert accuracy >= 0.95
    assert f"[0]<stdout>:checkpoint written to {checkpoint}" in lines
    saved = torch.load(checkpoint, weights_only=True)
    assert sorted(saved) == ["epoch", "model", "optimizer", "test_accuracy"]
    assert saved["epoch"] == 20 and round(saved["test_accuracy"], 4) == accuracy
    assert sorted(saved["model"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight"]
    assert int(saved["optimizer"]["state"][0]["step"]) == 20 * 22  # ceil(1347 / 2 ranks / 32) steps per epoch
