"""webiree: compile ONNX models ahead of time to WebGPU, run them natively,
in the browser, and from Python in the browser.

    import webiree
    webiree.compile("model.onnx", "site/")
    sess = webiree.InferenceSession("site/")
    outputs = sess.run(None, {"input": x})

Attributes are imported lazily, so the runtime core (module reader and
interpreter) can be used without numpy or onnx (as under Pyodide).
"""

from .errors import (CompilerBug, DeviceError, FeedError, LimitsError, ModelError, ShapeError,  # noqa: F401
                     UnsupportedOpError, WebireeError)

from .version import __version__  # noqa: F401


def __getattr__(name):
    if name == "compile":
        from .bundler.site import compile as _compile
        return _compile
    if name == "InferenceSession":
        from .session import InferenceSession
        return InferenceSession
    if name == "DeviceTensor":
        from .hal_webgpu.interpreter import DeviceTensor
        return DeviceTensor
    raise AttributeError(name)
