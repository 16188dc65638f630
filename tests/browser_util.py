"""Shared by the browser tests: serve a folder with webiree's server, launch Debian's Chromium."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"
# WebGPU on SwiftShader; --no-sandbox because the tests run as root
CHROMIUM_ARGS = ["--enable-unsafe-webgpu", "--no-sandbox"]


def serving(root):
    """webiree's dev server on a free loopback port, in a thread; yields the base URL."""
    from webiree.bundler.server import serve_in_thread
    return serve_in_thread(root)


@contextmanager
def chromium():
    """Headless Chromium through Playwright (never `playwright install`)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/setup.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


BLANK_PAGE = "blank.html"   # an empty page on the test server that hosts API tests


def write_blank_page(root) -> None:
    (root / BLANK_PAGE).write_text("<!doctype html><title>webiree test</title><link rel=icon href='data:,'>")


@contextmanager
def blank_page(browser, server: str):
    """A page on the server's blank.html in a fresh browser context (so an empty Cache Storage),
    collecting page errors in `.errors` and the requests for weights.bin in `.weight_requests`."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.errors, pg.weight_requests = [], []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("request", lambda r: pg.weight_requests.append(r) if r.url.endswith("/weights.bin") else None)
    pg.goto(server + BLANK_PAGE)
    try:
        yield pg
    finally:
        ctx.close()
