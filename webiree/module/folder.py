"""A build folder on disk: its file names, and opening it with one clear error per fault.

    DIR/manifest.json   model name, inputs, outputs, sizes, build options, version
    DIR/model.wrm       the schedule module (docs/schedule-module.md)
    DIR/weights.bin     the weights blob
    DIR/shaders/        each executable's WGSL (and .spv) for reading
    DIR/tokenizer.json  the model's Hugging Face tokenizer, when the build was given one

The bundler writes these names; the native session, `webiree run` / `inspect`
and the Pyodide runtime (over URLs) read them. Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelError
from .format import Module, ModuleFormatError, read_module

MODULE_FILE = "model.wrm"
WEIGHTS_FILE = "weights.bin"
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"     # the Hugging Face tokenizer, copied as given (webiree build --tokenizer)
SHADER_DIR = "shaders"


class BuildFolder:
    def __init__(self, path):
        self.path = Path(path)
        if not (self.path / MODULE_FILE).exists():
            if self.path.suffix == ".onnx" or self.path.is_file():
                raise ModelError(f"{self.path} is not a webiree build folder",
                                 hint=f"compile it first: webiree build {self.path} --out DIR")
            raise ModelError(f"no webiree build at {self.path} ({MODULE_FILE} missing)",
                             hint="give the folder written by `webiree build`")

    def module_bytes(self) -> bytes:
        return (self.path / MODULE_FILE).read_bytes()

    def module(self, raw: bytes | None = None) -> Module:
        try:
            return read_module(self.module_bytes() if raw is None else raw)
        except ModuleFormatError as e:
            raise ModelError(f"{self.path / MODULE_FILE} is corrupt: {e}", hint="rebuild the model") from None

    def weights(self) -> bytes:
        """The weights blob (empty when the build has none; the interpreter checks its size)."""
        p = self.path / WEIGHTS_FILE
        return p.read_bytes() if p.exists() else b""

    def manifest(self) -> dict:
        p = self.path / MANIFEST_FILE
        try:
            manifest = json.loads(p.read_text()) if p.exists() else {}
        except (ValueError, OSError) as e:
            raise ModelError(f"{p} is corrupt ({type(e).__name__})", hint="rebuild the model") from None
        return manifest if isinstance(manifest, dict) else {}
