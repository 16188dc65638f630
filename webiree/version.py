"""The webiree version (written into manifests and the runtime wheel)."""

__version__ = "0.1.0"
