"""The checks of ``inductor_xpugraph.config``: each setting's type and range, applied to values
from the environment, set in code, or patched. (A module of its own because every
module-level value of ``config`` becomes a setting.)

A bad value set in code or patched raises ValueError naming the setting and what it accepts,
and changes nothing: it is the program's own line, and the traceback points at it.

A bad value from the environment, read when the package is imported, is warned about once,
naming the variable and what it accepts, and ignored: the setting keeps its default, and a
bad device list enables nothing (not even xpu, the default). An environment value is set
outside the program (a shell profile, a job script shared by many programs), where a
traceback from ``import inductor_xpugraph`` would stop every program that imports the
package, most of which may never compile for the device; running with the default, told so,
costs at most the setting's effect. The warning is a ``SettingIgnoredWarning`` (a
UserWarning), attributed to the line that imported the package.

This package's own command line (``python -m inductor_xpugraph``, the ``inductor-xpugraph``
script) records each refused value in ``refused`` instead of warning: Python imports the
package before it runs the command, and ``doctor``, whose job is to report bad settings,
reports them as FAIL lines; every other command says each in one line and goes on, as a
program importing the package does. The exception is decided once, at import, from the
command line.
"""

import math
import os
import re
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _integer(minimum: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"inductor_xpugraph.config.{name} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    return check


def _gigabytes(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(
            f"inductor_xpugraph.config.{name} must be a number of GiB >= 0, got {value!r}"
        )
    return float(value)


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"inductor_xpugraph.config.{name} must be True or False, got {value!r}")
    return value


def _imported_by_the_command_line() -> bool:
    """Whether this process is this package's command line being started: ``python -m
    inductor_xpugraph ...`` (while Python imports the package, before it runs ``__main__``,
    ``sys.argv[0]`` is "-m" and ``sys.orig_argv`` ends with the module's name and the
    command's arguments) or the ``inductor-xpugraph`` script."""
    argv = getattr(sys, "argv", None) or [""]
    if argv[0] == "-m":
        original = getattr(sys, "orig_argv", [])
        module = original[-len(argv)] if len(original) > len(argv) else ""
        return re.fullmatch(r"(-[A-Za-z]*m)?inductor_xpugraph(\.__main__)?", module) is not None
    return os.path.splitext(os.path.basename(argv[0]))[0] == "inductor-xpugraph"


# Under the command line (see the module's docstring): variable -> why its value was refused at
# import, and what is applied instead. None everywhere else: there a refused value is warned about.
started_by_the_command_line = _imported_by_the_command_line()
refused: dict[str, str] | None = {} if started_by_the_command_line else None


class SettingIgnoredWarning(UserWarning):
    """An ``INDUCTOR_XPUGRAPH_*`` value the package does not accept, ignored at import."""


# What a refused value of each variable that is not a setting of ``config`` leaves applied:
# the device list, which ``codegen.registration`` reads and refuses as a whole.
_LEFT_WITHOUT_THE_VALUE = {
    "INDUCTOR_XPUGRAPH_DEVICES": "no device is enabled from it (not even xpu, the default)",
}
_warned: set[str] = set()  # variables warned about in this process


def refuse(variable: str, why: str, left: str | None = None) -> None:
    """Refuse the value of ``variable`` read at import, where ``why`` names the variable and
    what it accepts; the caller applies nothing of it. ``left``: what holds instead (the
    setting's default). Warned about once per variable (``SettingIgnoredWarning``), or,
    under the command line, recorded in ``refused``."""
    left = left or _LEFT_WITHOUT_THE_VALUE.get(variable, "nothing of it is applied")
    said = f"{why}; ignored: {left}"
    if refused is not None:
        refused[variable] = said
        return
    if variable in _warned:
        return
    _warned.add(variable)
    warnings.warn(said, SettingIgnoredWarning, stacklevel=_stack_level_of_the_importer())


def _stack_level_of_the_importer() -> int:
    """The ``stacklevel`` that attributes a warning given by ``refuse`` to the first frame
    outside this package and the import system (the line that imported the package),
    counted as ``warnings`` counts frames: from ``refuse``'s (1), skipping the import
    system's bootstrap frames, as it does."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(2), 1  # the frame that called refuse
    while frame is not None:
        filename = frame.f_code.co_filename
        bootstrap = "importlib" in filename and "_bootstrap" in filename
        if not bootstrap:
            level += 1
            if not (os.path.abspath(filename).startswith(package) or "importlib" in filename):
                return level
        frame = frame.f_back
    return 2


def from_environment(name: str, variable: str, default: Any) -> Any:
    """What ``config`` reads at import: ``environment_value``; a refused value goes to
    ``refuse``, and the setting keeps ``default``."""
    try:
        return environment_value(name, variable, default)
    except ValueError as error:
        refuse(variable, str(error), left=f"{name} keeps its default, {default!r}")
        return default


def environment_value(name: str, variable: str, default: Any) -> Any:
    """The value of setting ``name`` from ``variable`` if set, else ``default``; a value the
    setting does not accept raises ValueError naming the variable and what it accepts."""
    raw = os.environ.get(variable)
    if raw is None:
        return default
    text = raw.strip().lower()
    try:
        if isinstance(default, bool):
            if text not in _TRUE + _FALSE:
                raise ValueError(f"accepted: {'/'.join(_TRUE + _FALSE)}")
            value: Any = text in _TRUE
        elif isinstance(default, tuple):  # a comma-separated list
            value = tuple(item.strip() for item in raw.split(",") if item.strip())
        elif isinstance(default, str):  # one of the setting's choices
            value = text
        else:  # a number: one that does not parse is said as the setting's range says it
            value = _number(type(default), text, name)
        return CHECKS[name](name, value)
    except ValueError as error:
        raise ValueError(f"{variable}={raw!r} is not a valid value: {error}") from None


def _number(kind: type, text: str, name: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        CHECKS[name](name, text)  # raises what the setting accepts
        raise


def _positions(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple) or any(
        isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value
    ):
        raise ValueError(
            f"inductor_xpugraph.config.{name} must be a tuple of input positions (ints >= 0), "
            f"got {value!r}"
        )
    return value


_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?$")


def _op_names(name: str, value: Any) -> tuple[str, ...]:
    """Operator names as Inductor's ``custom_should_partition_ops`` takes them:
    ``namespace::name`` (every overload) or ``namespace::name.overload``."""
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple) or not all(
        isinstance(op, str) and _OP_NAME.match(op) for op in value
    ):
        raise ValueError(
            f"inductor_xpugraph.config.{name} must be a tuple of operator names such as "
            f"'aten::_scaled_dot_product_flash_attention' or 'mylib::op.default', got {value!r}"
        )
    return value


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(
                f"inductor_xpugraph.config.{name} must be one of "
                f"{', '.join(repr(choice) for choice in choices)}, got {value!r}"
            )
        return value

    return check


# Each setting's check, applied when it is read from the environment, set or patched.
CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "warmup_runs": _integer(1),
    "rerecord_limit": _integer(0),
    "rerecord_window": _integer(1),
    "static_input_variants": _integer(1),
    "dynamic_shape_warn_limit": _integer(1),
    "skip_dynamic_graphs": _boolean,
    "generation_cloning": _boolean,
    "copy_moving_inputs": _boolean,
    "keep_state_memory": _boolean,
    "initial_pool_allocation_gb": _gigabytes,
    "managed_input_rerecord_limit": _integer(0),
    "managed_input_rerecord_action": _choice("copy", "skip"),
    "pending_backward_records_limit": _integer(1),
    "allocator_checkpointing": _boolean,
    "debug_checks": _boolean,
    "capture_failure_raises": _boolean,
    "never_capture_ops": _op_names,
    "allow_capture_ops": _op_names,
    "_export_static_inputs": _positions,  # set by deploy.export only; no environment variable
    "xpu_graph_api": _choice("xpu", "accelerator"),
    "xpu_recording": _choice("auto", "command-buffer", "native"),
}


def checked_config_class(module: ModuleType) -> None:
    """Make the installed ConfigModule ``module`` check each value set or patched."""

    class CheckedConfigModule(module.__class__):  # type: ignore[misc,name-defined]
        def __setattr__(self, name: str, value: Any) -> None:
            check = CHECKS.get(name)
            super().__setattr__(name, value if check is None else check(name, value))

        def patch(self, arg1: Any = None, arg2: Any = None, **kwargs: Any) -> Any:
            # Every value is checked before any is applied: a bad one changes nothing.
            changes = dict(kwargs)
            if isinstance(arg1, str):
                changes[arg1] = arg2
            elif isinstance(arg1, dict):
                changes.update(arg1)
            for name, value in changes.items():
                if name in CHECKS:
                    CHECKS[name](name, value)
            return super().patch(arg1, arg2, **kwargs)

    # ConfigModule's own __setattr__ accepts only settings: go around it.
    ModuleType.__setattr__(module, "__class__", CheckedConfigModule)
