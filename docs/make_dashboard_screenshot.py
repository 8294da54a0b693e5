"""Make docs/dashboard.png: Dask's dashboard (/status) during a real src_dask run.

    python docs/make_dashboard_screenshot.py [--out docs/dashboard.png] [--after 6]

Starts a LocalCluster (2 workers, one thread each) and opens its /status page in
headless Chromium (Debian's ``chromium``), driven through the DevTools protocol
(Chromium's own ``--screenshot`` fires before Bokeh has drawn anything). Then it
runs MPO·MPS in a background thread (48 sites, MPO bond 4, MPS bond 320,
chi_out 320, complex128; about 20-40 s on two cores) with a progress bar, and
takes the picture ``--after`` seconds into pass 2, when the task stream holds
the whole of pass 1 and the progress bars show the ``pass2_site<j>``
prefixes. The PNG is reduced to a 256-colour palette with Pillow.
Not part of the library; needs bokeh (the dashboard), chromium and Pillow.
``tests/test_dashboard.py`` opens the dashboard's pages with its :class:`Browser`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from distributed import Client, LocalCluster

import src_dask

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--window-size=1400,900"]


class Tee(io.StringIO):
    """The progress bar's text: to stderr, and kept to know where the run is."""

    def write(self, text: str) -> int:
        sys.stderr.write(text)
        return super().write(text)


class Browser:
    """Headless Chromium in a fresh profile, and one page driven over DevTools."""

    def __init__(self) -> None:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            raise SystemExit("chromium not found (Debian: apt-get install -y chromium)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        self.process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--remote-debugging-port={self.port}",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.calls = 0

    async def connect(self) -> None:
        from tornado.websocket import websocket_connect

        base, deadline = f"http://127.0.0.1:{self.port}", time.monotonic() + 60
        while True:  # until the DevTools server answers
            try:
                with urllib.request.urlopen(f"{base}/json/list", timeout=1) as response:
                    targets = json.load(response)
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise SystemExit("chromium did not start its DevTools server") from None
                await asyncio.sleep(0.2)
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=2**28)

    async def call(self, method: str, **params: object) -> dict:
        """One DevTools command; its result."""
        self.calls += 1
        await self.ws.write_message(json.dumps({"id": self.calls, "method": method,
                                                "params": params}))
        while True:
            message = json.loads(await self.ws.read_message())
            if message.get("id") == self.calls:
                return message.get("result", {})

    async def open(self, url: str, wait: float = 2.0) -> int:
        """Load ``url``, let its scripts run ``wait`` seconds (Bokeh opens its session
        and draws), and return the HTTP status the page was served with."""
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        await asyncio.sleep(wait)
        answer = await self.call("Runtime.evaluate", returnByValue=True, expression=(
            "performance.getEntriesByType('navigation')[0].responseStatus"))
        return int(answer["result"]["value"])

    async def screenshot(self) -> bytes:
        return base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.profile.cleanup()


def shrink(path: Path) -> None:
    """Rewrite ``path`` as a 256-colour palette PNG (dashboards have few colours)."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


async def shoot(client: Client, run: threading.Thread, progress: Tee, out: Path,
                after: float, hover: tuple[int, int]) -> None:
    """Open the dashboard, start ``run``, and take the picture ``after`` s into pass 2."""
    browser = Browser()
    try:
        await browser.connect()
        await browser.call("Page.navigate", url=client.dashboard_link)
        await asyncio.sleep(3)  # Bokeh draws the empty page
        run.start()
        while "pass 2 of 2" not in progress.getvalue():
            if not run.is_alive():
                raise SystemExit("the run ended before pass 2 was seen")
            await asyncio.sleep(0.1)
        await asyncio.sleep(after)
        if not run.is_alive():
            raise SystemExit("the run ended before the picture; use a larger problem")
        # the pointer on the task stream: Bokeh's tooltip names the task under it
        for step in range(10, -1, -1):
            await browser.call("Input.dispatchMouseEvent", type="mouseMoved",
                               x=hover[0] - 10 * step, y=hover[1])
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        out.write_bytes(await browser.screenshot())
        sys.stderr.write("\nscreenshot taken\n")
        await browser.call("Page.navigate", url="about:blank")  # close the dashboard's socket
    finally:
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("dashboard.png"))
    parser.add_argument("--after", type=float, default=6.0,
                        help="seconds into pass 2 to take the picture")
    parser.add_argument("--hover", type=int, nargs=2, default=(700, 160), metavar=("X", "Y"),
                        help="where the pointer rests (on the task stream) in the picture")
    parser.add_argument("--sites", type=int, default=48)
    parser.add_argument("--bond", type=int, default=320)
    args = parser.parse_args()

    mpo = src_dask.problems.random_mpo(args.sites, 4, seed=1, decay=0.5)  # lazy: drawn
    mps = src_dask.problems.random_mps(args.sites, args.bond, seed=2, decay=0.9)  # in tasks
    progress = Tee()
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        sys.stderr.write(f"dashboard: {client.dashboard_link}\n")
        run = threading.Thread(target=src_dask.apply, args=(mpo, mps, args.bond),
                               kwargs={"seed": 0, "client": client, "chunk": args.bond // 8,
                                       "progress": progress})
        try:
            asyncio.run(shoot(client, run, progress, args.out, args.after, args.hover))
        finally:
            if run.is_alive():
                run.join()
    shrink(args.out)
    sys.stderr.write(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
