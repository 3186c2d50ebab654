"""Builds the package's compiled module against the torch of the environment it is installed
into (``inductor_xpugraph/native.py`` says what it is and how it is found). Install with
``pip install --no-build-isolation``: pip's isolated build environment has no torch (listing
torch as a build requirement would build against another copy of torch, often another
release). Without torch, a compiler or headers, the package installs without the module and
says at run time what that costs and how to add it. The project's metadata is pyproject.toml's.
"""

import importlib.util
import os
import sys

from setuptools import setup


def _native():
    """``inductor_xpugraph/native.py``, loaded by path (importing the package needs torch)."""
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "inductor_xpugraph", "native.py"
    )
    spec = importlib.util.spec_from_file_location("_inductor_xpugraph_native", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what its dataclass needs
    spec.loader.exec_module(module)
    return module


def _say(message):
    print(f"inductor_xpugraph: {message}", file=sys.stderr)


def _optional(build_extension):
    """torch's ``BuildExtension``, except that a failed build installs the package without the
    module, with the reason printed."""

    class OptionalBuildExtension(build_extension):
        def run(self):
            try:
                super().run()
            except Exception as error:
                _say(f"the compiled module was not built ({error}); the package works without it")
                self.extensions = []

        def get_outputs(self):
            return super().get_outputs() if self.extensions else []

    return OptionalBuildExtension


def _extensions():
    if os.environ.get("INDUCTOR_XPUGRAPH_NO_NATIVE") == "1":
        _say("INDUCTOR_XPUGRAPH_NO_NATIVE=1: installing without the compiled module")
        return []
    native = _native()
    try:
        extension = native.extension(source="inductor_xpugraph/csrc/stale_outputs.cpp")
    except ModuleNotFoundError:
        _say(
            "torch is not importable here (pip's isolated build environment?): installing "
            "without the compiled module; install torch first, then this package with "
            "`pip install --no-build-isolation`"
        )
        return []
    lacking = native.missing_tools()
    if lacking:
        _say(f"installing without the compiled module: this machine lacks {', '.join(lacking)}")
        return []
    return [extension]


_extension_modules = _extensions()
if _extension_modules:
    from torch.utils.cpp_extension import BuildExtension

    setup(ext_modules=_extension_modules, cmdclass={"build_ext": _optional(BuildExtension)})
else:
    setup()
