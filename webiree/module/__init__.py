"""The schedule module (see docs/schedule-module.md): pure-Python writer and reader."""

from .format import (BufferInfo, Executable, IOInfo, Module, ModuleFormatError, read_module,  # noqa: F401
                     write_module)
