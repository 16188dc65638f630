"""Tokenizers from a Hugging Face tokenizer.json, in pure Python (standard library only, so
Pyodide runs them): WordPiece (BERT) and byte-level BPE (GPT-2)."""

from .tokenizer import Encoding, Tokenizer

__all__ = ["Encoding", "Tokenizer"]
