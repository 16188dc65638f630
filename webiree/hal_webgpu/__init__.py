"""HAL: the interface, the schedule interpreter, and the drivers (wgpu-py, browser).

Importing this package imports no numpy and no wgpu: the interpreter is pure
Python so Pyodide can run it. Drivers are imported from their own modules.
"""

from .hal import Driver, Ready, run_sync  # noqa: F401
from .interpreter import Interpreter  # noqa: F401
