"""The compiler: ONNX -> graph IR -> canonical program -> dispatches -> schedule module."""
