"""Bundling a compiled model into a static site, and serving it locally."""
