"""hororun --config-file: horovodrun's YAML file of settings, its order against flags, its errors."""
import pytest

from hororun_helpers import hororun, worker


HOROVOD_CONFIG = """\
# a horovodrun --config-file, every section
controller: gloo
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  cache_capacity: 512
  hierarchical_allreduce: false
  hierarchical_allgather: true
autotune:
  enabled: true
  log_file: at.csv
  warmup_samples: 2
  steps_per_sample: 5
  bayes_opt_max_samples: 7
  gaussian_process_noise: 0.5
timeline:
  filename: tl.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 40
  shutdown_time_seconds: 90
library_options:
  num_nccl_streams: 2
logging:
  level: debug
  with_timestamp: false
"""


def test_config_file_sets_horovods_settings_and_later_flags_win(runner_path, monkeypatch, tmp_path, capsys):
    """horovodrun --config-file: each section becomes the matching flags; the file overrides the
    flags before it and the flags after it override the file; an option inside the command is the
    command's."""
    from horo_runner.launch import parse_args, settings_env
    monkeypatch.delenv("HORO_START_TIMEOUT", raising=False)
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text(HOROVOD_CONFIG)
    args = parse_args(["-np", "2", "--cycle-time-ms", "9", "--hierarchical-allreduce", "--config-file", str(cfg),
                       "--cache-capacity", "3", "--no-hierarchical-allgather", "python", "t.py",
                       "--config-file", "other.yaml", "--cache-capacity", "1"])
    assert args.command == ["python", "t.py", "--config-file", "other.yaml", "--cache-capacity", "1"]
    assert settings_env(args) == {
        "HORO_START_TIMEOUT": "30", "HORO_FUSION_THRESHOLD": str(32 << 20),
        "HORO_CYCLE_TIME": "2.5",              # the file wins over the flag before it
        "HORO_CACHE_CAPACITY": "3",            # the flag after the file wins
        "HORO_HIERARCHICAL_ALLREDUCE": "0",    # false in the file, over --hierarchical-allreduce before
        "HORO_HIERARCHICAL_ALLGATHER": "0",    # --no-hierarchical-allgather after the file
        "HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": "at.csv", "HORO_AUTOTUNE_WARMUP_SAMPLES": "2",
        "HORO_AUTOTUNE_STEPS_PER_SAMPLE": "5", "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
        "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5",
        "HORO_TIMELINE": "tl.json", "HORO_TIMELINE_MARK_CYCLES": "1",
        "HORO_STALL_CHECK_DISABLE": "1", "HORO_STALL_CHECK_TIME_SECONDS": "40",
        "HORO_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HORO_LOG_LEVEL": "DEBUG", "HORO_LOG_HIDE_TIME": "1"}
    err = capsys.readouterr().err
    assert "ignoring controller: gloo" in err and "ignoring library_options.num_nccl_streams" in err
    cfg.write_text("version: 1\nparams:\n  hierarchical_allreduce: true\n  cycel_time_ms: 3\n"
                   "timeline:\n  filename:\n")
    env = settings_env(parse_args(["-np", "2", "--config-file", str(cfg), "true"]))
    assert env["HORO_HIERARCHICAL_ALLREDUCE"] == "1" and "HORO_CYCLE_TIME" not in env
    assert "HORO_TIMELINE" not in env  # a key with no value sets nothing
    err = capsys.readouterr().err
    assert f"ignoring unknown key params.cycel_time_ms in {cfg}" in err
    assert f"ignoring unknown section version in {cfg}" in err
    # horovodrun's hidden negations, after the file, undo what it switched on.
    cfg.write_text(HOROVOD_CONFIG)
    env = settings_env(parse_args(["-np", "2", "--config-file", str(cfg), "--no-autotune", "--stall-check",
                                   "--no-timeline-mark-cycles", "--log-with-timestamp", "true"]))
    for name in ("HORO_AUTOTUNE", "HORO_STALL_CHECK_DISABLE", "HORO_TIMELINE_MARK_CYCLES", "HORO_LOG_HIDE_TIME"):
        assert name not in env, name
    # horovodrun's older spellings of --log-without-timestamp and its negation, and abbreviations.
    assert settings_env(parse_args(["-np", "2", "--log-hide-timestamp", "true"]))["HORO_LOG_HIDE_TIME"] == "1"
    assert "HORO_LOG_HIDE_TIME" not in settings_env(parse_args(["-np", "2", "--log-hide-timestamp",
                                                                "--no-log-hide-timestamp", "true"]))
    args = parse_args(["--num-p", "2", "--output-file", "out", "--verb", "--timeline-file", "t.json", "python",
                       "train.py", "--verb"])
    assert (args.num_proc, args.output_filename, args.verbose, args.command) == (2, "out", True,
                                                                                  ["python", "train.py", "--verb"])
    assert settings_env(args)["HORO_TIMELINE"] == "t.json"
    # 1 and 0 for true and false in the file, as horovodrun reads them.
    cfg.write_text("params:\n  hierarchical_allreduce: 1\ntimeline:\n  mark_cycles: 0\n")
    env = settings_env(parse_args(["-np", "2", "--config-file", str(cfg), "true"]))
    assert env["HORO_HIERARCHICAL_ALLREDUCE"] == "1" and "HORO_TIMELINE_MARK_CYCLES" not in env


@pytest.mark.parametrize("text, message", [
    ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms: expected a number, got 'fast'"),
    ("params:\n  cache_capacity: true\n", "params.cache_capacity: expected a number or a string, got True"),
    ("params:\n  hierarchical_allreduce: 2\n", "params.hierarchical_allreduce: expected true or false, got 2"),
    ("params:\n  hierarchical_allreduce: yes please\n", "expected true or false, got 'yes please'"),
    ("autotune:\n  gaussian_process_noise: 2\n", "autotune.gaussian_process_noise:"),
    ("autotune:\n  steps_per_sample: 0\n", "autotune.steps_per_sample:"),
    ("logging:\n  level: loud\n", "logging.level: expected one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL, got 'loud'"),
    ("controller: nccl\n", "controller: expected gloo or mpi, got 'nccl'"),
    ("params: 3\n", "section 'params' must be a mapping of keys, got 3"),
    ("- params\n", "expected a mapping of sections, got list"),
    ("params: [\n", "not valid YAML"),
    ("params:\n  fusion_threshold_mb: .inf\n", "params.fusion_threshold_mb: must be a finite number >= 0, got inf"),
    ("params:\n  cycle_time_ms: -1\n", "params.cycle_time_ms: must be a finite number >= 0, got -1"),
    (b"params:\n  cycle_time_ms: 2 # caf\xe9\n", "not UTF-8 text"),
])
def test_config_file_errors_name_the_key(runner_path, tmp_path, capsys, text, message):
    from horo_runner.launch import parse_args
    cfg = tmp_path / "bad.yaml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SystemExit) as exc:
        parse_args(["-np", "2", "--config-file", str(cfg), "true"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--config-file {cfg}" in err and message in err, err


def test_config_file_reaches_the_workers(child_env, tmp_path):
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text("params:\n  cycle_time_ms: 1.5\nstall_check:\n  warning_time_seconds: 45\n")
    proc = hororun(child_env, "-np", "2", "--config-file", str(cfg),
                   *worker("import os; print(os.environ['HORO_CYCLE_TIME'], os.environ['HORO_STALL_CHECK_TIME_SECONDS'])"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["[0]<stdout>:1.5 45", "[1]<stdout>:1.5 45"]
    missing = hororun(child_env, "-np", "1", "--config-file", str(tmp_path / "none.yaml"), "true")
    assert missing.returncode == 2
    assert f"--config-file {tmp_path / 'none.yaml'}: No such file or directory" in missing.stderr.decode()


def test_gloo_timeout_raises_the_start_timeout(runner_path, monkeypatch, tmp_path):
    """horovodrun's --gloo-timeout-seconds (library_options.gloo_timeout_seconds) is how long init
    waits for every rank under Gloo: a job that raised it for slow-starting ranks failed after
    hororun's 30 s start timeout, with the flag ignored. It now raises the start timeout."""
    from horo_runner.launch import parse_args, settings_env
    monkeypatch.delenv("HORO_START_TIMEOUT", raising=False)
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    args = parse_args(["-np", "2", "--gloo-timeout-seconds", "120", "true"])
    assert settings_env(args)["HORO_START_TIMEOUT"] == "120"
    assert parse_args(["-np", "2", "--start-timeout", "200", "--gloo-timeout-seconds", "120", "true"]).start_timeout \
        == 200
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text("library_options:\n  gloo_timeout_seconds: 90\n")
    assert parse_args(["-np", "2", "--config-file", str(cfg), "true"]).start_timeout == 90


def test_a_flag_overrides_an_exported_horovod_variable_quietly(child_env):
    """horovodrun exports its flags under Horovod's names, so a flag beats an exported HOROVOD_*
    variable without a word. hororun set only HORO_*, so every rank logged that the variable the
    user exported was ignored, and a script reading HOROVOD_CYCLE_TIME saw the exported value."""
    code = """
        import os
        import horo_torch as hvd
        from horo_core import config
        hvd.init()
        print(config.value("CYCLE_TIME"), os.environ["HOROVOD_CYCLE_TIME"], os.environ["HOROVOD_START_TIMEOUT"])
    """
    proc = hororun({**child_env, "HOROVOD_CYCLE_TIME": "10"}, "-np", "1", "--cycle-time-ms", "2",
                   "--start-timeout", "40", *worker(code))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().split(":", 1)[1].split() == ["2", "2", "40"], proc.stdout
    assert "is ignored" not in proc.stderr.decode(), proc.stderr
