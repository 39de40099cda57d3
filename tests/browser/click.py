#!/usr/bin/env python3
"""Open an HTML report in headless Chromium, click one heatmap cell with a
real mouse event (DevTools protocol over --remote-debugging-pipe), and print
what the page shows as JSON: the panel's title, text, strip bars and inputs,
and the page's load time. Standard library only.

    python3 tests/browser/click.py REPORT.html L1/attn [--screenshot out.png]

Exit 2 when chromium is missing or the page cannot be driven.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, exe, width, height):
        self.dir = tempfile.mkdtemp(prefix="taptree-chromium-")
        log = open(os.path.join(self.dir, "chromium.log"), "wb")
        self.log = log.name
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():
            # Chromium reads commands on fd 3 and answers on fd 4 (moved
            # out of the way first: the pipes may already sit on 3 or 4;
            # pass_fds keeps 3 and 4 open through the fd closing that
            # follows this function).
            r, w = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self.dir}",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds,
            stdout=subprocess.DEVNULL, stderr=log)
        os.close(to_child_r)
        os.close(from_child_w)
        self.next_id = 0
        self.buf = b""
        self.events = []

    def send(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self.read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def read(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise RuntimeError("chromium did not answer in time")
            chunk = os.read(self.from_child, 1 << 20)
            if not chunk:
                with open(self.log, errors="replace") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"chromium closed the pipe; its log ends:\n{tail}")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def wait_event(self, method, timeout=60):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self.read(deadline))

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


PANEL = """(() => {
  const p = document.getElementById('panel');
  const t = document.getElementById('panel-title');
  return {
    hidden: p.hidden,
    title: t ? t.textContent : null,
    text: p.innerText,
    bars: p.querySelectorAll('rect.pos').length,
    failing: p.querySelectorAll('rect.pos.fail').length,
    inputs: [...p.querySelectorAll('.inputs a')].map(a => a.textContent),
    tokens: [...p.querySelectorAll('svg.strip text')].map(e => e.textContent),
    selected: [...document.querySelectorAll('.heat td.sel')].map(e => e.dataset.name),
  };
})()"""


def evaluate(b, session, expr):
    r = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                    "awaitPromise": True}, session)
    if "exceptionDetails" in r:
        raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
    return r["result"].get("value")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("cells", nargs="+", help="row names to click in turn (L1/attn)")
    ap.add_argument("--screenshot", help="a PNG of the page after the clicks")
    ap.add_argument("--width", type=int, default=1240)
    ap.add_argument("--scale", type=float, default=1.0, help="of the screenshot")
    args = ap.parse_args()
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("click.py: chromium is not installed (apt-get install -y chromium)", file=sys.stderr)
        return 2
    b = Browser(exe, args.width, 900)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        b.send("Page.enable", session=session)
        b.send("Runtime.enable", session=session)
        url = "file://" + os.path.abspath(args.report)
        t0 = time.time()
        b.send("Page.navigate", {"url": url}, session)
        b.wait_event("Page.loadEventFired", timeout=120)
        out = {"wall_load_ms": round((time.time() - t0) * 1000),
               "load_ms": evaluate(b, session, "Math.round(performance.getEntriesByType('navigation')[0].loadEventEnd)"),
               "before": evaluate(b, session, PANEL), "clicks": []}
        for name in args.cells:
            where = evaluate(b, session, """(() => {
              const c = [...document.querySelectorAll('.heat td[data-name]')].find(e => e.dataset.name === %s);
              if (!c) return null;
              c.scrollIntoView({block: 'center'});
              const r = c.getBoundingClientRect();
              return [r.x + r.width / 2, r.y + r.height / 2];
            })()""" % json.dumps(name))
            if where is None:
                out["clicks"].append({"cell": name, "found": False})
                continue
            for kind in ("mousePressed", "mouseReleased"):
                b.send("Input.dispatchMouseEvent", {"type": kind, "x": where[0], "y": where[1],
                                                    "button": "left", "clickCount": 1}, session)
            shown = evaluate(b, session, PANEL)
            shown.update({"cell": name, "found": True})
            out["clicks"].append(shown)
        if args.screenshot:
            evaluate(b, session, "window.scrollTo(0, 0)")
            # Down to the panel's bottom (or the page's, with no panel open).
            height = evaluate(b, session, """(() => {
              const p = document.getElementById('panel');
              const e = p && !p.hidden ? p : document.documentElement;
              return Math.ceil(e.getBoundingClientRect().bottom + window.scrollY + 12);
            })()""")
            height = min(height, 2400)
            b.send("Emulation.setDeviceMetricsOverride", {"width": args.width, "height": height,
                                                          "deviceScaleFactor": 1, "mobile": False}, session)
            shot = b.send("Page.captureScreenshot", {"format": "png", "clip": {
                "x": 0, "y": 0, "width": args.width, "height": height, "scale": args.scale}}, session)
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        print(json.dumps(out))
        return 0
    except RuntimeError as e:
        print(f"click.py: {args.report}: {e}", file=sys.stderr)
        return 2
    finally:
        b.close()


if __name__ == "__main__":
    sys.exit(main())
