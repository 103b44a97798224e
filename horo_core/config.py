"""The core's settings table as Python sees it: name, type, default, effective value and doc of
every ``HORO_<NAME>`` setting (``HOROVOD_<NAME>`` honoured too). The table itself lives in the core
(common/config.cc); this module only reads it through the C ABI."""
import dataclasses
from typing import List

from horo_core._binding import check, ffi, lib


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: str
    default: str
    value: str
    doc: str


def settings() -> List[Setting]:
    """Every setting with its effective value in this process's environment.

    Raises:
        ValueError: an environment variable holds a value that does not parse.
    """
    count = ffi.new("int32_t*")
    check(lib.horo_setting_count(count))
    out = []
    item = ffi.new("horo_setting_t*")
    for i in range(count[0]):
        check(lib.horo_setting_get(i, item))
        text = [ffi.string(getattr(item, f)).decode() for f in ("name", "type", "default_value", "value", "doc")]
        out.append(Setting(*text))
    return out


def value(name: str) -> str:
    """The effective value of one setting, as text."""
    for s in settings():
        if s.name == name:
            return s.value
    raise KeyError(f"unknown setting {name}")


def as_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")
