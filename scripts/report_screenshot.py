"""Regenerate docs/report-screenshot.png from the current report with headless Chromium.

    pagebench report --quick            # writes reports/index.html
    python scripts/report_screenshot.py # writes docs/report-screenshot.png

The page is opened from disk with every network request refused (it needs none), and the top of
it (header, recommendation, claims table) is captured at a fixed width. ``--selector`` captures
one element instead (e.g. ``'#kernels'``), for checking a section's layout.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 300_000  # the README's image stays small


def screenshot(page_path: Path, out: Path, *, width: int, height: int,
               selector: str | None = None) -> int:
    """Capture ``page_path`` into ``out`` (PNG); returns its size in bytes."""
    from playwright import sync_api

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found: `make browser-deps` installs Debian's package")
    if not page_path.is_file():
        raise SystemExit(f"{page_path}: no report there (run `pagebench report --quick` first)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
                ("file:", "data:")) else route.abort())
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            if selector:
                page.locator(selector).first.screenshot(path=str(out))
            else:
                page.screenshot(path=str(out), full_page=False)
        finally:
            browser.close()
    return out.stat().st_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=ROOT / "reports" / "index.html",
                    help="the report to capture (default: reports/index.html)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report-screenshot.png",
                    help="PNG to write (default: docs/report-screenshot.png)")
    ap.add_argument("--width", type=int, default=1200, help="viewport width in pixels")
    ap.add_argument("--height", type=int, default=1100, help="viewport height in pixels")
    ap.add_argument("--selector", help="capture this element only (CSS selector)")
    args = ap.parse_args(argv)
    size = screenshot(args.page, args.out, width=args.width, height=args.height,
                      selector=args.selector)
    print(f"wrote {args.out} ({size / 1000:.0f} kB)")
    if not args.selector and size > MAX_BYTES:
        print(f"{args.out}: {size:,} bytes, over the {MAX_BYTES:,} the README allows; "
              "use a smaller --height", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
