"""``hororun --config-file FILE``: Horovod's YAML file of launcher settings.

The file has horovodrun's sections and keys::

    params:        {fusion_threshold_mb, cycle_time_ms, cache_capacity,
                    hierarchical_allreduce, hierarchical_allgather}
    autotune:      {enabled, log_file, warmup_samples, steps_per_sample,
                    bayes_opt_max_samples, gaussian_process_noise}
    timeline:      {filename, mark_cycles}
    stall_check:   {enabled, warning_time_seconds, shutdown_time_seconds}
    logging:       {level, with_timestamp}
    controller:    gloo | mpi            (accepted; hororun has one controller)
    library_options: {gloo_timeout_seconds, and mpi_threads_disable, num_nccl_streams,
                      ccl_bgt_affinity: accepted and ignored, as the matching flags}

As horovodrun documents it, the file overrides the flags given before ``--config-file`` and is
overridden by those given after it (horovodrun's code lets every flag win, wherever it stands;
the hidden negations ``--no-autotune``, ``--stall-check``, ``--no-timeline-mark-cycles`` and
``--log-with-timestamp`` undo a value from the file). A key with no value sets nothing. A value is checked as the matching flag's argument would be; a
wrong type or value is a usage error naming the file and the key. Keys hororun does not know get a
warning (horovodrun ignores them silently, which hides typos).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, Set, Tuple

# (section, key) -> (argparse dest, how the value becomes that dest's value)
_Converter = Callable[[Any, Callable[[str], Any]], Any]


def _scalar(value: Any, parse: Callable[[str], Any]) -> Any:
    """A number or string, checked by the flag's own argument parser."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number or a string, got {value!r}")
    return parse(str(value))


def _boolean(value: Any, _parse: Callable[[str], Any]) -> bool:
    """true/false, or 1/0 as horovodrun also takes them (it tests the value's truth)."""
    if isinstance(value, int) and value in (0, 1):  # True and False included
        return bool(value)
    raise ValueError(f"expected true or false, got {value!r}")


def _negated(value: Any, parse: Callable[[str], Any]) -> bool:
    return not _boolean(value, parse)


# A true/false key that turns one of two mutually exclusive flags on: (dest if true, dest if false).
_TOGGLES = {
    ("params", "hierarchical_allreduce"): ("hierarchical_allreduce", "no_hierarchical_allreduce"),
    ("params", "hierarchical_allgather"): ("hierarchical_allgather", "no_hierarchical_allgather"),
}

_KEYS: Dict[Tuple[str, str], Tuple[str, _Converter]] = {
    ("params", "fusion_threshold_mb"): ("fusion_threshold_mb", _scalar),
    ("params", "cycle_time_ms"): ("cycle_time_ms", _scalar),
    ("params", "cache_capacity"): ("cache_capacity", _scalar),
    ("autotune", "enabled"): ("autotune", _boolean),
    ("autotune", "log_file"): ("autotune_log_file", _scalar),
    ("autotune", "warmup_samples"): ("autotune_warmup_samples", _scalar),
    ("autotune", "steps_per_sample"): ("autotune_steps_per_sample", _scalar),
    ("autotune", "bayes_opt_max_samples"): ("autotune_bayes_opt_max_samples", _scalar),
    ("autotune", "gaussian_process_noise"): ("autotune_gaussian_process_noise", _scalar),
    ("timeline", "filename"): ("timeline_filename", _scalar),
    ("timeline", "mark_cycles"): ("timeline_mark_cycles", _boolean),
    ("stall_check", "enabled"): ("no_stall_check", _negated),
    ("stall_check", "warning_time_seconds"): ("stall_check_warning_time_seconds", _scalar),
    ("stall_check", "shutdown_time_seconds"): ("stall_check_shutdown_time_seconds", _scalar),
    ("logging", "level"): ("log_level", _scalar),
    ("logging", "with_timestamp"): ("log_without_timestamp", _negated),
    ("library_options", "gloo_timeout_seconds"): ("gloo_timeout_seconds", _scalar),
}

# Keys horovodrun reads that configure what hororun does not have (like the matching flags).
_IGNORED_KEYS = {("library_options", k) for k in ("mpi_threads_disable", "num_nccl_streams", "ccl_bgt_affinity")}
_CONTROLLERS = ("gloo", "mpi")
_SECTIONS = {section for section, _ in list(_KEYS) + list(_TOGGLES) + list(_IGNORED_KEYS)}


class ConfigFileError(ValueError):
    """The file cannot be read or holds a value its key does not take."""


def load(path: str) -> Dict[str, Any]:
    """Reads the YAML file: a mapping of sections (``controller`` is a string, the others mappings).

    Raises:
        ConfigFileError: the file is missing, is not YAML, or is not shaped as above.
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency of the package
        raise ConfigFileError("--config-file needs PyYAML (pip install pyyaml)") from None
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ConfigFileError(f"--config-file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigFileError(f"--config-file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigFileError(f"--config-file {path}: not valid YAML: {e}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigFileError(f"--config-file {path}: expected a mapping of sections, got {type(config).__name__}")
    for section, body in config.items():
        if section in _SECTIONS and body is not None and not isinstance(body, dict):
            raise ConfigFileError(f"--config-file {path}: section {section!r} must be a mapping of keys, "
                                  f"got {body!r}")
    return config


_ORDER = "_options_in_order"


def record_order(parser: argparse.ArgumentParser) -> None:
    """Makes every option of parser append its dest to ``namespace._options_in_order`` when it
    appears on the command line, so that :func:`apply` knows which flags came after the file.
    (argparse itself stops at the command: an option inside it is the command's.)"""
    recording: Dict[type, type] = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        base = type(action)
        if base not in recording:
            def __call__(self, parser, namespace, values, option_string=None, _base=base):
                order = getattr(namespace, _ORDER, None)
                if order is None:
                    order = []
                    setattr(namespace, _ORDER, order)
                order.append(self.dest)
                _base.__call__(self, parser, namespace, values, option_string)
            recording[base] = type("Recording" + base.__name__, (base,), {"__call__": __call__})
        action.__class__ = recording[base]


def _given_after_file(args: argparse.Namespace) -> Set[str]:
    order = getattr(args, _ORDER, None) or []
    last = max((i for i, dest in enumerate(order) if dest == "config_file"), default=len(order))
    return set(order[last + 1:])


def apply(args: argparse.Namespace, parser: argparse.ArgumentParser,
          warn: Callable[[str], None] = lambda m: sys.stderr.write(f"hororun: warning: {m}\n")) -> None:
    """Sets args from ``args.config_file``, except the flags given after ``--config-file``
    (parser must have gone through :func:`record_order` before it parsed args).

    Raises:
        ConfigFileError: the file or one of its values is wrong (the message names the key).
    """
    path = args.config_file
    config = load(path)
    overriding = _given_after_file(args)
    parse_of = {a.dest: (a.type or str) for a in parser._actions}

    controller = config.get("controller")
    if controller is not None:
        if not isinstance(controller, str) or controller.lower() not in _CONTROLLERS:
            raise ConfigFileError(f"--config-file {path}: controller: expected gloo or mpi, got {controller!r}")
        warn(f"ignoring controller: {controller} from {path}; hororun has a single controller")

    for section, body in config.items():
        if section == "controller":
            continue
        if section not in _SECTIONS:
            warn(f"ignoring unknown section {section} in {path}")
            continue
        for key, value in (body or {}).items():
            where = f"--config-file {path}: {section}.{key}"
            if value is None:  # "key:" with nothing after it sets nothing, as in horovodrun
                continue
            if (section, key) in _IGNORED_KEYS:
                warn(f"ignoring {section}.{key} from {path}, which does not apply to hororun")
                continue
            if (section, key) in _TOGGLES:
                on, off = _TOGGLES[(section, key)]
                if on in overriding or off in overriding:
                    continue
                try:
                    enabled = _boolean(value, str)
                except ValueError as e:
                    raise ConfigFileError(f"{where}: {e}") from None
                setattr(args, on, enabled)
                setattr(args, off, not enabled)
                continue
            if (section, key) not in _KEYS:
                warn(f"ignoring unknown key {section}.{key} in {path}")
                continue
            dest, convert = _KEYS[(section, key)]
            if dest in overriding:
                continue
            try:
                converted = convert(value, parse_of[dest])
            except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
                raise ConfigFileError(f"{where}: {e}") from None
            if dest == "log_level":
                converted = converted.upper()
                choices = next(a.choices for a in parser._actions if a.dest == dest)
                if converted not in choices:
                    raise ConfigFileError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
            setattr(args, dest, converted)
