"""Regenerate docs/report-screenshot.png from the current report with headless Chromium.

    pagebench report --quick            # writes reports/index.html
    python scripts/report_screenshot.py # writes docs/report-screenshot.png

The page is opened from disk with every network request refused (it needs none) and captured at a
fixed width: its header, headline and claims table (the other sections are hidden for the
picture; the page on disk is not changed). ``--selector`` captures one element instead (e.g.
``'#kernels'``), for checking a section's layout.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 300_000  # the README's image stays small
# the README's picture: the page's header, headline and claims table
HIDE_FOR_PICTURE = "nav, main > section:not(#claims) { display: none !important; }"


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
                page.add_style_tag(content=HIDE_FOR_PICTURE)
                page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()
    if not selector:
        palette_png(out)
    return out.stat().st_size


def palette_png(path: Path, colors: int = 128) -> None:
    """Rewrite the PNG with a palette: a page of text and charts keeps its look at a third of
    the size."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    small.save(path, "PNG", optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=ROOT / "reports" / "index.html",
                    help="the report to capture (default: reports/index.html)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report-screenshot.png",
                    help="PNG to write (default: docs/report-screenshot.png)")
    ap.add_argument("--width", type=int, default=1200, help="viewport width in pixels")
    ap.add_argument("--height", type=int, default=900,
                    help="viewport height in pixels (the picture is as tall as its content)")
    ap.add_argument("--selector", help="capture this element only (CSS selector)")
    args = ap.parse_args(argv)
    size = screenshot(args.page, args.out, width=args.width, height=args.height,
                      selector=args.selector)
    print(f"wrote {args.out} ({size / 1000:.0f} kB)")
    if not args.selector and size > MAX_BYTES:
        print(f"{args.out}: {size:,} bytes, over the {MAX_BYTES:,} the README allows; "
              "use a smaller --width", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
