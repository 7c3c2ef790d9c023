#!/usr/bin/env python3
"""The course website in a real browser (./lab site --test).

Serves the built site over HTTP on localhost (a static host, as an instructor would publish
it) and drives headless Chromium through Selenium:

  1. loads every HTML page of the site; a page fails when its title is empty, an image did not
     load (naturalWidth 0), the server answered 404 to any request it made (styles, scripts,
     images), or the browser logged an error;
     every figure (an SVG image in the page's text) is a link to the SVG itself (click to
     enlarge);
  2. every link of every page that stays on the site names a page or file of the site, and its
     #anchor exists in that page;
  3. the search box finds a word every lab uses;
  4. screenshots of a lab page (its top, and scrolled to its first figure) and of the figures
     page, checked: the window's size, not blank (enough colours, enough non-white pixels),
     and one figure rendered as an element.

Screenshots are written to --shots. Exit status 0 when everything holds.

Usage: test_site.py --site DIR --shots DIR [--lab-page labs/12_pipeline_schedules/index.html]
"""

import argparse
import functools
import html.parser
import http.server
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

WIDTH, HEIGHT = 1280, 900

# ---------------------------------------------------------------- the static host


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    missing = []  # paths answered 404, in order

    def log_message(self, fmt, *args):
        pass

    def send_error(self, code, message=None, explain=None):
        if code == 404:
            QuietHandler.missing.append(urllib.parse.unquote(self.path))
        super().send_error(code, message, explain)


def serve(site):
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


# ---------------------------------------------------------------- the browser


def browser(profile):
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("DTL_CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--hide-scrollbars",
                 f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("DTL_CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(30)
    return driver


def load(driver, url):
    driver.get(url)
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.readyState") == "complete")


BROKEN_IMAGES = """
return Array.from(document.images)
  .filter(i => !(i.complete && i.naturalWidth > 0))
  .map(i => i.getAttribute('src'));
"""
LINKS = "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href);"
# Figures not wrapped in a link to themselves (build_site.py's enlarge()).
NOT_ENLARGEABLE = """
return Array.from(document.querySelectorAll('article img'))
  .filter(i => /\\.svg$/.test(i.getAttribute('src') || ''))
  .filter(i => { const a = i.closest('a'); return !a || a.href !== i.src; })
  .map(i => i.getAttribute('src'));
"""


# ---------------------------------------------------------------- anchors


class Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("id", "name") and v:
                self.ids.add(v)


@functools.lru_cache(maxsize=None)
def ids_of(path):
    p = Ids()
    p.feed(Path(path).read_text(errors="replace"))
    return p.ids


# ---------------------------------------------------------------- screenshots


def check_png(path, want_w, want_h, what):
    """Problems with a screenshot: wrong size, blank (few colours or almost all white)."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    small = img.resize((max(1, w // 4), max(1, h // 4)))
    pixels = list(small.getdata())
    colours = len(set(pixels))
    ink = sum(1 for p in pixels if sum(p) < 3 * 235) / len(pixels)
    print(f"  screenshot {path.name}: {w} x {h} px, {colours} colours, {100 * ink:.1f}% non-white")
    out = []
    if want_w and (w, h) != (want_w, want_h):
        out.append(f"{what}: {w} x {h} px, expected {want_w} x {want_h}")
    if colours < 16 or ink < 0.02:
        out.append(f"{what}: blank ({colours} colours, {100 * ink:.1f}% non-white)")
    return out


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True, type=Path)
    ap.add_argument("--shots", required=True, type=Path)
    ap.add_argument("--lab-page", default="labs/12_pipeline_schedules/index.html")
    ap.add_argument("--figure-page", default="figures.html")
    ap.add_argument("--search", default="bubble", help="a word the search must find")
    args = ap.parse_args()
    site = args.site.resolve()
    args.shots.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    server, base = serve(site)
    problems, links, images, enlargeable = [], {}, 0, [0]
    with tempfile.TemporaryDirectory(prefix="dtl-chromium-") as profile:
        driver = browser(profile)
        try:
            print(f"site test: {len(pages)} pages from {base} in {driver.capabilities.get('browserName')} "
                  f"{driver.capabilities.get('browserVersion')} (headless)")
            # 1. every page
            for page in pages:
                QuietHandler.missing.clear()
                driver.get_log("browser")  # drop what earlier pages left
                load(driver, base + page)
                if not driver.title.strip():
                    problems.append(f"{page}: empty title")
                for src in driver.execute_script(BROKEN_IMAGES):
                    problems.append(f"{page}: image did not load: {src}")
                for src in driver.execute_script(NOT_ENLARGEABLE):
                    problems.append(f"{page}: figure {src} is not a link to itself (click to "
                                    "enlarge)")
                figures = driver.execute_script(
                    "return document.querySelectorAll('article a > img').length")
                enlargeable[0] += figures
                images += driver.execute_script("return document.images.length")
                time.sleep(0.05)  # late requests (search index, icons)
                for path in list(QuietHandler.missing):
                    if page != "404.html":
                        problems.append(f"{page}: the server has no {path}")
                for entry in driver.get_log("browser"):
                    if entry.get("level") == "SEVERE":
                        problems.append(f"{page}: browser error: {entry.get('message')}")
                for href in driver.execute_script(LINKS):
                    if href.startswith(base):
                        links.setdefault(href, page)

            # 2. every link that stays on the site
            for href, page in sorted(links.items()):
                url = urllib.parse.urlsplit(href)
                rel = urllib.parse.unquote(url.path)[1:] if url.path != "/" else "index.html"
                target = site / rel
                if target.is_dir():
                    target = target / "index.html"
                if not target.is_file():
                    problems.append(f"{page}: broken link {href[len(base):]}")
                elif url.fragment and target.suffix == ".html" and \
                        urllib.parse.unquote(url.fragment) not in ids_of(str(target)):
                    problems.append(f"{page}: link to a missing anchor {href[len(base):]}")

            # 3. search
            load(driver, base + "index.html")
            box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
            box.click()
            box.send_keys(args.search)
            try:
                WebDriverWait(driver, 20).until(lambda d: d.find_elements(
                    By.CSS_SELECTOR, ".md-search-result__item"))
                hits = len(driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
                print(f"  search '{args.search}': {hits} results")
            except Exception:  # noqa: BLE001 (a timeout: no results)
                problems.append(f"search: no results for '{args.search}'")
            box.send_keys(Keys.ESCAPE)

            # 4. screenshots
            load(driver, base + args.lab_page)
            # The screenshot is the viewport: the window less the browser's own frame.
            vw, vh = driver.execute_script("return [window.innerWidth, window.innerHeight]")
            if vw != WIDTH:
                problems.append(f"viewport {vw} px wide, the window asked for {WIDTH}")

            def shoot(name, what):
                shot = args.shots / name
                driver.save_screenshot(str(shot))
                return check_png(shot, vw, vh, f"screenshot of {what}")

            def first_figure(page):
                """Scrolls to the page's first figure and returns it (None: a problem)."""
                figs = driver.find_elements(By.CSS_SELECTOR, "article img[src$='.svg']")
                if not figs:
                    problems.append(f"{page}: no figure")
                    return None
                driver.execute_script("arguments[0].scrollIntoView();", figs[0])
                time.sleep(0.2)
                return figs[0]

            problems += shoot("lab-page.png", args.lab_page)
            if first_figure(args.lab_page):  # the handout at its figure, as a reader scrolls
                problems += shoot("lab-page-figure.png", f"{args.lab_page} at its figure")
            load(driver, base + args.figure_page)
            problems += shoot("figure-page.png", args.figure_page)
            fig = first_figure(args.figure_page)
            if fig:
                shot = args.shots / "figure.png"
                fig.screenshot(str(shot))
                w, h = Image.open(shot).size
                problems += check_png(shot, 0, 0, f"the first figure of {args.figure_page}")
                if w < 300 or h < 150:
                    problems.append(f"the first figure renders at {w} x {h} px (too small)")
        finally:
            driver.quit()
            server.shutdown()

    print(f"  {len(pages)} pages, {images} images ({enlargeable[0]} in a link: figures "
          f"click to enlarge), {len(links)} distinct links checked; "
          f"screenshots in {args.shots}")
    if problems:
        print(f"site test: FAILED ({len(problems)} problems, {time.time() - t0:.1f} s)")
        for p in problems:
            print(f"  {p}")
        return 1
    print(f"site test: passed in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
