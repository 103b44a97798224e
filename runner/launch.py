"""``hororun``: the command line (``hororun -np 4 -H localhost:4 python train.py``).

Flags keep Horovod's names and meanings. Tuning flags become ``HORO_*`` variables in every worker's
environment (:data:`SETTINGS_FLAGS`). Horovod flags that do not apply to hororun are accepted with
a warning; those whose absence would change what the job does (elastic mode) are refused.
``--config-file`` reads horovodrun's YAML file of the same settings (:mod:`.config_file`).
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Callable, Optional, Sequence

from . import config_file
from .binding import BIND_MODES

DEFAULT_START_TIMEOUT = 30.0  # seconds, as horovodrun
MAX_START_TIMEOUT = 1_000_000  # the workers' bound (config.cc): deadlines must fit a clock's count

__all__ = ["main", "parse_args", "settings_env", "SETTINGS_FLAGS"]

_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def number_text(value: float) -> str:
    """The text of a number for a worker's environment, exact (no rounding to 6 digits)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


def _flag(value: bool) -> Optional[str]:
    return "1" if value else None


SETTINGS_FLAGS: tuple[tuple[str, str, Callable[[object], Optional[str]]], ...] = (
    # (argparse dest, worker environment variable, value -> text, or None to leave unset)
    ("start_timeout", "HORO_START_TIMEOUT", number_text),
    ("fusion_threshold_mb", "HORO_FUSION_THRESHOLD", lambda mb: str(int(mb * 1024 * 1024))),
    ("cycle_time_ms", "HORO_CYCLE_TIME", number_text),
    ("cache_capacity", "HORO_CACHE_CAPACITY", str),
    ("no_stall_check", "HORO_STALL_CHECK_DISABLE", _flag),
    ("stall_check_warning_time_seconds", "HORO_STALL_CHECK_TIME_SECONDS", str),
    ("stall_check_shutdown_time_seconds", "HORO_STALL_SHUTDOWN_TIME_SECONDS", str),
    ("timeline_filename", "HORO_TIMELINE", str),
    ("timeline_mark_cycles", "HORO_TIMELINE_MARK_CYCLES", _flag),
    ("log_level", "HORO_LOG_LEVEL", str),
    ("log_without_timestamp", "HORO_LOG_HIDE_TIME", _flag),
    ("hierarchical_allreduce", "HORO_HIERARCHICAL_ALLREDUCE", _flag),
    ("no_hierarchical_allreduce", "HORO_HIERARCHICAL_ALLREDUCE", lambda value: "0" if value else None),
    ("hierarchical_allgather", "HORO_HIERARCHICAL_ALLGATHER", _flag),
    ("no_hierarchical_allgather", "HORO_HIERARCHICAL_ALLGATHER", lambda value: "0" if value else None),
    ("autotune", "HORO_AUTOTUNE", _flag),
    ("autotune_log_file", "HORO_AUTOTUNE_LOG", str),
    ("autotune_warmup_samples", "HORO_AUTOTUNE_WARMUP_SAMPLES", str),
    ("autotune_steps_per_sample", "HORO_AUTOTUNE_STEPS_PER_SAMPLE", str),
    ("autotune_bayes_opt_max_samples", "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", str),
    ("autotune_gaussian_process_noise", "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", number_text),
    ("tcp", "NCCL_IB_DISABLE", _flag),  # as horovodrun: NCCL (Horo's CUDA path) keeps off InfiniBand
)

# Horovod flags that do not apply here: (option strings, takes a value).
_IGNORED_FLAGS = (
    (("--gloo",), False), (("--mpi",), False), (("--jsrun",), False),
    (("--disable-cache",), False), (("--mpi-threads-disable",), False), (("--no-mpi-threads-disable",), False),
    (("--torus-allreduce",), False), (("--no-torus-allreduce",), False),
    (("--network-interfaces",), True), (("--network-interface",), True),
    (("-p", "--ssh-port"), True), (("-i", "--ssh-identity-file"), True),
    (("--mpi-args",), True), (("--binding-args",), True), (("--num-nccl-streams",), True),
    (("--thread-affinity",), True),
)
# Horovod flags that would change the job's meaning if ignored: (option strings, nargs).
_REFUSED_FLAGS = (
    (("--min-np", "--min-num-proc"), 1), (("--max-np", "--max-num-proc"), 1),
    (("--slots-per-host",), 1), (("--elastic-timeout",), 1), (("--reset-limit",), 1),
    (("--blacklist-cooldown-range",), 2), (("--host-discovery-script",), 1),
)


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps group descriptions (the lists of Horovod flags) without cutting a flag at a hyphen."""

    def _fill_text(self, text, width, indent):
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)


def _parsed(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _non_negative_int(text: str) -> int:
    value = _parsed(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _parsed(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_number(text: str) -> float:
    value = _parsed(text, float, "a number")
    if not 0.0 <= value < float("inf"):  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _at_most(parse: Callable[[str], float], limit: float) -> Callable[[str], float]:
    """parse, refusing values above limit (the workers' own bound, config.cc), so that a value the
    workers would reject fails here, before any rank starts."""
    def checked(text: str) -> float:
        value = parse(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit}, got {text}")
        return value
    return checked


_MAX_DURATION = 1_000_000  # cycle time (ms) and stall times (s): config.cc's bound
_MAX_FUSION_MB = (2 ** 63 - 1) // (1 << 20)  # the threshold in bytes must fit an int64
_MAX_FILTERED_RANK = 1 << 20  # --rank-filter's ranges are expanded: a bound keeps "0-99999999999" small


def _unit_interval(text: str) -> float:
    value = _parsed(text, float, "a number")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value:g}")
    return value


def _dest(option_strings: Sequence[str]) -> str:
    return option_strings[-1].lstrip("-").replace("-", "_")


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hororun", formatter_class=_HelpFormatter,  # abbreviations as horovodrun takes them
        description="Launch a Horo job: run COMMAND as NP ranks with a shared, authenticated "
                    "rendezvous. Output lines are prefixed [<rank>]<stdout>: / [<rank>]<stderr>:.",
        epilog="Example: hororun -np 4 python train.py")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int, metavar="NP",
                   help="number of processes to run (required)")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show which frameworks, controllers and tensor operations are available")
    p.add_argument("--start-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds every rank has to register with the rendezvous once the first "
                        "has (default, and 0: HORO_START_TIMEOUT or HOROVOD_START_TIMEOUT, else 30; "
                        "HORO_START_TIMEOUT in the workers)")
    p.add_argument("--gloo-timeout-seconds", type=_non_negative_number, default=None, metavar="SECONDS",
                   help="horovodrun's wait of init() for every rank (Gloo); here it raises the start "
                        "timeout to at least this")
    p.add_argument("--output-filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.<rank>/{stdout,stderr}")
    p.add_argument("--verbose", action="store_true", help="describe the launch on stderr")
    p.add_argument("--config-file", metavar="FILE",
                   help="horovodrun's YAML file of settings (sections params, autotune, timeline, "
                        "stall_check, logging); it overrides the flags before it, the flags after "
                        "it override it")
    p.add_argument("--bind-to", choices=BIND_MODES, default="auto",
                   help="CPUs of each rank: 'auto' gives every rank its own share of this host's "
                        "cores when there are at least as many cores as ranks (2 or more), and one "
                        "core per rank, shared by neighbouring ranks, when there are more ranks; "
                        "'core' insists on shares of their own, 'none' binds nothing (default: auto)")
    p.add_argument("--tcp", action="store_true",
                   help="keep NCCL (CUDA tensors) off InfiniBand: NCCL_IB_DISABLE=1 in the workers; "
                        "Horo's own transport is shared memory and TCP already")

    hosts = p.add_argument_group("hosts")
    hosts.add_argument("-H", "--hosts", metavar="HOSTS",
                       help='comma-separated host:slots list (default "localhost:NP"); only this '
                            "machine is supported for now")
    hosts.add_argument("-hostfile", "--hostfile", metavar="FILE",
                       help='file with "host slots=N" or "host:N" lines')

    tuning = p.add_argument_group("tuning")
    tuning.add_argument("--fusion-threshold-mb", type=_at_most(_non_negative_number, _MAX_FUSION_MB), metavar="MB",
                        help="fusion buffer size in MiB; 0 disables fusion (HORO_FUSION_THRESHOLD)")
    tuning.add_argument("--cycle-time-ms", type=_at_most(_non_negative_number, _MAX_DURATION), metavar="MS",
                        help="background cycle time in milliseconds (HORO_CYCLE_TIME)")
    tuning.add_argument("--cache-capacity", type=_non_negative_int, metavar="N",
                        help="response cache entries; 0 disables it (HORO_CACHE_CAPACITY)")
    hierarchical = tuning.add_mutually_exclusive_group()
    hierarchical.add_argument("--hierarchical-allreduce", action="store_true",
                              help="reduce inside each host first, then across hosts "
                                   "(HORO_HIERARCHICAL_ALLREDUCE=1; the default already does so "
                                   "whenever a process set spans hosts)")
    hierarchical.add_argument("--no-hierarchical-allreduce", action="store_true",
                              help="always use the flat allreduce algorithms "
                                   "(HORO_HIERARCHICAL_ALLREDUCE=0)")
    hierarchical_gather = tuning.add_mutually_exclusive_group()
    hierarchical_gather.add_argument("--hierarchical-allgather", action="store_true",
                                     help="gather inside each host first, then across hosts "
                                          "(HORO_HIERARCHICAL_ALLGATHER=1; the default already "
                                          "does so whenever a process set spans hosts)")
    hierarchical_gather.add_argument("--no-hierarchical-allgather", action="store_true",
                                     help="always use the ring allgather "
                                          "(HORO_HIERARCHICAL_ALLGATHER=0)")

    timeline = p.add_argument_group("timeline")
    timeline.add_argument("--timeline-filename", metavar="FILE",
                          help="rank 0 writes a timeline of every rank's collectives to FILE, a "
                               "Chrome trace that ui.perfetto.dev opens (HORO_TIMELINE)")
    timeline.add_argument("--timeline-mark-cycles", action="store_true",
                          help="mark the start of every negotiation round in the timeline "
                               "(HORO_TIMELINE_MARK_CYCLES=1)")
    # horovodrun's hidden negations (here and below): after --config-file they undo the file's value.
    timeline.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles", action="store_false",
                          default=False, help=argparse.SUPPRESS)

    autotune = p.add_argument_group("autotune")
    autotune.add_argument("--autotune", action="store_true",
                          help="tune the fusion threshold, cycle time and allreduce crossover during "
                               "the first steps; settings given explicitly stay fixed (HORO_AUTOTUNE=1)")
    autotune.add_argument("--no-autotune", dest="autotune", action="store_false", default=False,
                          help=argparse.SUPPRESS)
    autotune.add_argument("--autotune-log-file", metavar="FILE",
                          help="CSV that rank 0 writes with every autotune sample and the chosen "
                               "setting (HORO_AUTOTUNE_LOG)")
    autotune.add_argument("--autotune-warmup-samples", type=_non_negative_int, metavar="N",
                          help="samples discarded before tuning (default 3; "
                               "HORO_AUTOTUNE_WARMUP_SAMPLES)")
    autotune.add_argument("--autotune-steps-per-sample", type=_positive_int, metavar="N",
                          help="steps per measurement; a sample is the median of 5 (default 10; "
                               "HORO_AUTOTUNE_STEPS_PER_SAMPLE)")
    autotune.add_argument("--autotune-bayes-opt-max-samples", type=_positive_int, metavar="N",
                          help="samples of the Bayesian optimisation of fusion threshold and cycle "
                               "time (default 20; HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES)")
    autotune.add_argument("--autotune-gaussian-process-noise", type=_unit_interval, metavar="NOISE",
                          help="measurement noise the Gaussian process assumes, in [0, 1] "
                               "(default 0.8; HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE)")

    stall = p.add_argument_group("stall check")
    stall.add_argument("--no-stall-check", action="store_true",
                       help="disable the stall check (HORO_STALL_CHECK_DISABLE=1)")
    stall.add_argument("--stall-check", dest="no_stall_check", action="store_false", default=False,
                       help=argparse.SUPPRESS)
    stall.add_argument("--stall-check-warning-time-seconds", type=_at_most(_non_negative_int, _MAX_DURATION),
                       metavar="SECONDS",
                       help="warn about a stall after this long (HORO_STALL_CHECK_TIME_SECONDS)")
    stall.add_argument("--stall-check-shutdown-time-seconds", type=_at_most(_non_negative_int, _MAX_DURATION),
                       metavar="SECONDS",
                       help="shut down after a stall this long; 0 never "
                            "(HORO_STALL_SHUTDOWN_TIME_SECONDS)")

    logging_group = p.add_argument_group("logging")
    logging_group.add_argument("--log-level", choices=_LOG_LEVELS, type=str.upper,
                               help="core log level (HORO_LOG_LEVEL)")
    logging_group.add_argument("--log-without-timestamp", action="store_true",
                               help="omit timestamps from core logs (HORO_LOG_HIDE_TIME=1)")
    logging_group.add_argument("--log-with-timestamp", "--no-log-hide-timestamp", dest="log_without_timestamp",
                               action="store_false", default=False, help=argparse.SUPPRESS)
    # horovodrun's older spelling, which it still takes (hidden, as there).
    logging_group.add_argument("--log-hide-timestamp", dest="log_without_timestamp", action="store_true",
                               help=argparse.SUPPRESS)
    logging_group.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                               dest="prefix_timestamp", action="store_true",
                               help="precede each output line's prefix with a timestamp")
    logging_group.add_argument("--rank-filter", type=_rank_list, metavar="RANKS",
                               help="show only these ranks' output, e.g. 0 or 0,2-3 (--output-filename "
                                    "still gets every rank's); a hidden rank that fails has its last "
                                    "stderr lines shown")

    ignored = p.add_argument_group("Horovod flags accepted and ignored (with a warning)")
    for options, takes_value in _IGNORED_FLAGS:
        if takes_value:
            ignored.add_argument(*options, dest="ignored_" + _dest(options), action="append",
                                 metavar="VALUE", help=argparse.SUPPRESS)
        else:
            ignored.add_argument(*options, dest="ignored_" + _dest(options),
                                 action="store_true", help=argparse.SUPPRESS)
    ignored.description = ", ".join(o[-1] for o, _ in _IGNORED_FLAGS)
    refused = p.add_argument_group("Horovod flags not supported yet (refused)")
    for options, nargs in _REFUSED_FLAGS:
        refused.add_argument(*options, dest="refused_" + _dest(options), nargs=nargs,
                             help=argparse.SUPPRESS)
    refused.description = ", ".join(o[-1] for o, _ in _REFUSED_FLAGS)

    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    config_file.record_order(p)
    return p


def _rank_list(text: str) -> frozenset[int]:
    """``--rank-filter``'s ranks: comma-separated ranks and ranges, e.g. ``0,2-3``."""
    ranks = set()
    for part in text.split(","):
        refusal = argparse.ArgumentTypeError(f"{part.strip()!r} is not a rank or a range of ranks (like 0,2-3)")
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise refusal from None
        if low < 0 or high < low or high > _MAX_FILTERED_RANK:
            raise refusal
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses hororun's command line.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The parsed namespace.

    Raises:
        SystemExit: with code 2 on a usage error (argparse's convention).
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    controllers = [o[-1] for o in (("--gloo",), ("--mpi",), ("--jsrun",)) if getattr(args, "ignored_" + _dest(o))]
    if len(controllers) > 1:  # one mutually exclusive group in horovodrun
        parser.error(f"{' and '.join(controllers)} choose different controllers; give at most one")
    for options, _ in _REFUSED_FLAGS:
        if getattr(args, "refused_" + _dest(options)) is not None:
            parser.error(f"{'/'.join(options)} is for elastic training, which Horo does not implement; "
                         "run a fixed number of ranks with -np")
    if args.config_file is not None:
        try:
            config_file.apply(args, parser)
        except config_file.ConfigFileError as e:
            parser.error(str(e))
    if args.version or args.check_build:
        return args
    if args.num_proc is None:
        parser.error("-np/--num-proc is required")
    if args.num_proc < 1:
        parser.error(f"-np must be at least 1, got {args.num_proc}")
    if not args.command:
        parser.error("no command given")
    if args.hosts and args.hostfile:
        parser.error("use either -H/--hosts or --hostfile, not both")
    if not args.start_timeout:  # 0 too, as horovodrun reads it: the default
        try:
            args.start_timeout = start_timeout_from_env(os.environ)
        except ValueError as e:
            parser.error(str(e))
    if args.gloo_timeout_seconds:  # Horovod's wait for every rank in init is the start timeout here
        args.start_timeout = max(args.start_timeout, args.gloo_timeout_seconds)
    if not 0 < args.start_timeout <= MAX_START_TIMEOUT:
        parser.error(f"--start-timeout must be > 0 and at most {MAX_START_TIMEOUT} seconds, got {args.start_timeout:g}")
    return args


def start_timeout_from_env(environ) -> float:
    """The start timeout when none is given: HORO_START_TIMEOUT, then horovodrun's
    HOROVOD_START_TIMEOUT, else 30 seconds.

    Raises:
        ValueError: the variable that decides is not a number in (0, 1e6] (the message names it).
    """
    for name in ("HORO_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        text = environ.get(name, "").strip()
        if not text:
            continue
        try:
            seconds = float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds") from None
        if not 0 < seconds <= MAX_START_TIMEOUT:
            raise ValueError(f"{name} must be > 0 and at most {MAX_START_TIMEOUT} seconds, got {text!r}")
        return seconds
    return DEFAULT_START_TIMEOUT


def settings_env(args: argparse.Namespace) -> dict[str, str]:
    """Translates tuning flags into the ``HORO_*`` variables the workers receive.

    Args:
        args: namespace from :func:`parse_args`.

    Returns:
        Variable name to value, only for the flags that were given (and the start timeout).
    """
    env = {}
    for dest, name, convert in SETTINGS_FLAGS:
        value = getattr(args, dest)
        if value is None or value is False:
            continue
        text = convert(value)
        if text is not None:
            env[name] = text
    return env


def with_horovod_names(env: dict[str, str]) -> dict[str, str]:
    """env plus Horovod's name of each ``HORO_*`` variable with the same value, as horovodrun
    exports its flags: a script that reads ``HOROVOD_FUSION_THRESHOLD`` sees the flag's value, and
    an exported ``HOROVOD_*`` variable that a flag overrides is not reported as the one ignored."""
    return {**env, **{"HOROVOD_" + name[len("HORO_"):]: text for name, text in env.items()
                      if name.startswith("HORO_")}}


def _warn_ignored(args: argparse.Namespace) -> None:
    for options, _ in _IGNORED_FLAGS:
        if getattr(args, "ignored_" + _dest(options)):
            sys.stderr.write(f"hororun: warning: ignoring {options[-1]}, which does not apply "
                             f"to hororun\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hororun`` console script.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, the first failing rank's exit code (``128 + signal`` for a
        signal), 1 for a start timeout, 2 for a usage error.
    """
    args = parse_args(argv)
    # The launcher imports the core package only after -v/-cb, so both work on a broken build.
    from .check_build import check_build, launcher_version

    if args.version:
        sys.stdout.write(f"{launcher_version()}\n")
        return 0
    if args.check_build:
        return check_build(sys.stdout)
    _warn_ignored(args)

    from .hosts import parse_hostfile, parse_hosts
    from .job import JobSpec, run_job

    try:
        hosts = (parse_hosts(args.hosts) if args.hosts
                 else parse_hostfile(args.hostfile) if args.hostfile else None)
        spec = JobSpec(command=args.command, num_proc=args.num_proc, hosts=hosts,
                       settings_env=with_horovod_names(settings_env(args)), start_timeout=args.start_timeout,
                       output_dir=args.output_filename, prefix_timestamp=args.prefix_timestamp,
                       shown_ranks=args.rank_filter,
                       verbose=args.verbose, bind_to=args.bind_to)
        result = run_job(spec)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"hororun: error: {e}\n")
        return 2
    if result.exit_code != 0:
        sys.stderr.write(f"hororun: {result.message}\n")
        sys.stderr.flush()
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
