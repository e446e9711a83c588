#!/usr/bin/env python3
"""Loads a tedsim HTML report in headless Chromium and fails unless it renders cleanly.

usage: check_html_report.py REPORT.html [--plots N] [--screenshot OUT.png] [--browser PATH]

Fails (exit 1) when:
  - the page outside its scripts names anything to fetch (src=, href=, url(...), @import, <link>),
  - the browser requested any URL while loading it (Chromium's own network log),
  - any console message, script error or rejected promise occurred (the page's self-check records
    them, and Chromium's console log must be empty),
  - fewer than N plots rendered, or any plot drew no marks,
  - the page is blank (no text, or a screenshot of almost one colour).
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib


def browser_command(explicit):
    for candidate in [explicit, os.environ.get("TEDSIM_BROWSER"), "chromium-headless-shell", "chromium"]:
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    sys.exit("check_html_report: no headless Chromium (Debian: chromium-headless-shell; scripts/install-deps.sh installs it)")


def run_browser(browser, url, extra, workdir):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--enable-logging=stderr", "--v=0", f"--user-data-dir={workdir}/profile",
           "--virtual-time-budget=20000", "--run-all-compositor-stages-before-draw"] + extra + [url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def static_fetches(html):
    outside_scripts = re.sub(r"<script\b[^>]*>.*?</script>", "", html, flags=re.S | re.I)
    patterns = [r"\bsrc\s*=", r"\bhref\s*=", r"url\s*\(", r"@import", r"<link\b", r"<iframe\b", r"<object\b", r"<embed\b"]
    return [p for p in patterns if re.search(p, outside_scripts, re.I)]


def png_colours(path, limit=64):
    """Distinct colours among the screenshot's pixels (8-bit RGB/RGBA PNG), up to `limit`."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour_type = struct.unpack(">IIBB", body[:10])
            channels = {2: 3, 6: 4}.get(colour_type)
            assert depth == 8 and channels, f"unexpected PNG format {depth}/{colour_type}"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    colours, prev = set(), bytearray(stride)
    for row in range(len(raw) // (stride + 1)):
        f = raw[row * (stride + 1)]
        line = bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):  # undo the PNG filters
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        if row % 7 == 0:
            for x in range(0, width, 5):
                colours.add(bytes(line[x * channels:x * channels + 3]))
            if len(colours) >= limit:
                break
    return len(colours)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--plots", type=int, default=1, help="plots the page must hold at least")
    ap.add_argument("--screenshot", help="write a PNG of the whole page here")
    ap.add_argument("--browser")
    args = ap.parse_args()
    path = os.path.abspath(args.report)
    html = open(path, encoding="utf-8").read()
    problems = []
    for p in static_fetches(html):
        problems.append(f"the page names something to fetch outside its scripts ({p})")
    browser = browser_command(args.browser)
    url = "file://" + path
    with tempfile.TemporaryDirectory() as work:
        netlog = os.path.join(work, "net.json")
        r = run_browser(browser, url, ["--dump-dom", f"--log-net-log={netlog}"], work)
        console = [l for l in r.stderr.splitlines() if ":CONSOLE" in l]
        problems += [f"browser console: {l}" for l in console]
        try:
            events = json.load(open(netlog)).get("events", [])
        except (OSError, ValueError):
            events = None
            problems.append("the browser wrote no network log")
        fetched = sorted({e["params"]["url"] for e in events or [] if "url" in e.get("params", {})})
        problems += [f"the browser fetched {u}" for u in fetched]
        m = re.search(r'data-tedsim-status="([^"]*)"', r.stdout)
        if 'data-tedsim-done="1"' not in r.stdout or not m:
            problems.append("the page never finished rendering its plots (no data-tedsim-done)")
            status = {"plots": [], "errors": []}
        else:
            import html as htmllib
            status = json.loads(htmllib.unescape(m.group(1)))
        problems += [f"page error: {e}" for e in status["errors"]]
        plots = status["plots"]
        if len(plots) < args.plots:
            problems.append(f"{len(plots)} plots rendered, expected at least {args.plots}")
        for p in plots:
            if p["marks"] <= 0:
                problems.append(f"plot {p['id']} drew no marks")
        body_text = re.sub(r"<script\b.*?</script>|<style\b.*?</style>|<[^>]+>", " ", r.stdout, flags=re.S)
        if len(body_text.split()) < 5:
            problems.append("the page shows (almost) no text")
        height = max(600, min(16000, int(status.get("height", 2400))))
        if args.screenshot:
            shot = os.path.abspath(args.screenshot)
            r2 = run_browser(browser, url, [f"--screenshot={shot}", f"--window-size=1240,{height}", "--hide-scrollbars"], work)
            if not os.path.exists(shot):
                problems.append("no screenshot was written: " + r2.stderr[-300:])
            elif png_colours(shot) < 8:
                problems.append("the screenshot is (almost) one colour: a blank page")
    summary = ", ".join(f"{p['id']} {p['marks']} marks" for p in plots)
    if problems:
        print(f"{args.report}: FAILED", *problems, sep="\n  ")
        return 1
    print(f"{args.report}: ok, {len(plots)} plots ({summary}), nothing fetched, no console messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
