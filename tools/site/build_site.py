#!/usr/bin/env python3
"""Build the course website from the repository's own Markdown (./lab site).

The site is the handouts (labs/NN_slug/README.md), the lecture notes (notes/*.md) with their
figures (notes/figures/*.svg), the syllabus, the README and the instructors' pages, each at the
same relative path as in the repository, so every relative link that works on a Git host works
in the site too. What this script adds:

  - a staging tree (docs/ + mkdocs.yml) with navigation by lab: one section per lab holding its
    handout and its note, then the tools and the instructors' pages;
  - a generated "Figures" page: every committed figure with its alt text and the pages that
    show it;
  - code pages: each lab's interface, skeleton, demo, benchmark and public tests, and the
    runtime's and harness's headers, as a page of its own (FILE.md, in each lab's "Code"
    section), and every link of a page to such a file points at its page;
  - a link check before mkdocs runs: a relative link or image in any page that does not name a
    file of the site fails the build, naming the page and the link (mkdocs itself only warns
    about Markdown pages, and not at all about images);
  - click to enlarge: every figure (an SVG image) is wrapped in a link to the SVG itself, so a
    reader opens it at full size (the column shows it at most 688 px wide);
  - a check of the numbers quoted beside the measured figures: the Markdown between
    <!-- figure-data NAME begin/end --> markers must be what the figure's own data gives
    (tools/figures/figdata.py; ./lab figures rewrites them), and every figure's text legible
    at the column's width (a warning: figures drawn before the rule are listed);
  - a citation check: a paper cited under "Further reading", "Sources" or "References" in a note
    or handout (an item with an italic title and a year, or with "et al.") without an http link
    fails the build, naming the file and line; <!-- no link: reason --> exempts an item;
  - mkdocs build --strict with the Material theme (Debian's mkdocs and mkdocs-material), no web
    fonts (the site works offline and on any static host).

Usage: build_site.py --root REPO --stage DIR --out DIR
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# ---------------------------------------------------------------- what the site holds


def lab_dirs(root):
    return sorted(p for p in (root / "labs").iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))


def syllabus_titles(root):
    """{"01": "Why LLM training becomes ..."} from labs/SYLLABUS.md's table."""
    titles = {}
    for line in (root / "labs" / "SYLLABUS.md").read_text().splitlines():
        # | 01 | [`01_slug`](01_slug/README.md) | [Title](../notes/01-slug.md) | ...
        m = re.match(r"\|\s*(\d\d)\s*\|\s*\[?`[^`]+`(?:\]\([^)]*\))?\s*\|\s*\[?([^|\]]+?)\]?(?:\([^)]*\))?\s*\|", line)
        if m:
            titles[m.group(1)] = m.group(2)
    return titles


def first_heading(path):
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def pages(root):
    """Repository-relative paths of every Markdown page of the site, in no particular order."""
    out = ["README.md", "labs/SYLLABUS.md", "labs/README.md", "grading/README.md"]
    out += [f"labs/{d.name}/README.md" for d in lab_dirs(root)]
    out += [f"notes/{p.name}" for p in sorted((root / "notes").glob("*.md"))]
    return [p for p in out if (root / p).is_file()]


def code_files(root):
    """Repository-relative paths of the code a student reads, each shown as a page of its own:
    every lab's interface, skeleton, demo, benchmark and public tests, and the runtime's and the
    harness's headers they include."""
    out = []
    for d in lab_dirs(root):
        for pattern in ("*.hpp", "*.cpp", "tests/*.hpp", "tests/*.cpp", "peers/*.py"):
            out += [str(p.relative_to(root)) for p in sorted(d.glob(pattern))]
    for pattern in ("common/include/dtl/*.hpp", "harness/include/dtl/harness/*.hpp"):
        out += [str(p.relative_to(root)) for p in sorted(root.glob(pattern))]
    return out


def code_page(root, rel):
    """A code file as Markdown: its path, where it sits, then the file in a fenced block."""
    text = (root / rel).read_text()
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    lang = {".py": "python"}.get(Path(rel).suffix, "cpp")
    return (f"# {rel}\n\n`{rel}` in the repository: read it there, or here.\n\n"
            f"{fence}{lang}\n{text.rstrip()}\n{fence}\n")


CODE_LINK = re.compile(r"(?P<open>!?\[[^\]]*\]\()(?P<target>[^)\s#]+)(?P<rest>[#)\s])")


def link_code_pages(page, text, code):
    """A page's links to a code file point at that file's page (FILE.md) in the site."""
    def fix(m):
        target = m.group("target")
        if not is_relative(target):
            return m.group(0)
        path = os.path.normpath(os.path.join(os.path.dirname(page), target))
        return m.group("open") + (target + ".md" if path in code else target) + m.group("rest")
    return CODE_LINK.sub(fix, text)


SVG_IMAGE = re.compile(r"(?<!\[)(?P<image>!\[[^\]]*\]\((?P<target>[^)\s]+\.svg)\))(?!\]\()")


def enlarge(text):
    """Every SVG image of a page as a link to itself: click to see the figure at full size
    (outside fenced code blocks; an image that is a link already is left alone)."""
    out, in_code = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            line = SVG_IMAGE.sub(lambda m: f"[{m.group('image')}]({m.group('target')})", line)
        out.append(line)
    return "\n".join(out)


def check_figures(root):
    """(problems, warnings): the quoted numbers against the figures' data (problems), and
    figures with text under the legible size or numbers still to generate (warnings)."""
    sys.path.insert(0, str(root / "tools" / "figures"))
    import figdata  # standard library only: no matplotlib needed to check
    problems, warnings = figdata.check(root)
    for svg in sorted((root / "notes" / "figures").glob("*.svg")):
        width, smallest, small = figdata.legibility(svg.read_text())
        if small:
            warnings.append(f"notes/figures/{svg.name}: smallest text {smallest:.1f} px at the "
                            f"site's width (under {figdata.MIN_PX:g}): redraw it (./lab figures)")
    return problems, warnings


def assets(root):
    return [f"notes/figures/{p.name}" for p in sorted((root / "notes" / "figures").glob("*.svg"))]


# ---------------------------------------------------------------- links

LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def links(text):
    """(is_image, text, target) of every Markdown link outside fenced code blocks."""
    out, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for m in LINK.finditer(line):
            out.append((m.group(0).startswith("!"), m.group("text"), m.group("target")))
    return out


def is_relative(target):
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith(("#", "/"))


def check_links(root, site_files):
    """Every relative link of every page names a file of the site. Returns the problems."""
    problems = []
    for page in site_files:
        if not page.endswith(".md"):
            continue
        for is_image, _, target in links((root / page).read_text()):
            if not is_relative(target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if path in site_files:
                continue
            where = "an image that is not" if is_image else "a link to a file that is not"
            hint = ("it exists in the repository: link a handout or note, or an absolute URL"
                    if (root / path).exists() else "no such file")
            problems.append(f"{page}: {where} in the site: {target} ({hint})")
    return problems


# ---------------------------------------------------------------- citations

READING = re.compile(r"^## .*\b(Further reading|Sources|References)\b", re.I)
ITALIC = re.compile(r"(?<![*\w])\*[^*\s][^*]*\*(?![*\w])")
YEAR = re.compile(r"\b(19|20)\d\d\b")
NO_LINK = "<!-- no link:"


def reading_items(text):
    """(line number, text) of each bullet or paragraph under a "Further reading", "Sources" or
    "References" heading (## level) of a page."""
    out, insec, item, start = [], False, [], 0
    lines = text.splitlines()
    for n, line in enumerate(lines + [""], 1):
        new_bullet = line.startswith(("- ", "* ")) and insec
        if not line.strip() or line.startswith("#") or new_bullet:
            if item:
                out.append((start, " ".join(item)))
            item = []
        if line.startswith("## "):
            insec = bool(READING.match(line))
            continue
        if insec and line.strip() and not line.startswith("#"):
            if not item:
                start = n
            item.append(line.strip())
    return out


def check_citations(root, site_files):
    """Every paper cited in a note's or handout's reading section carries a link. A paper is an
    item with an italic title and a year, or with "et al."; software and documentation items
    (no year) are exempt, and so is an item marked <!-- no link: reason -->. Returns the
    problems."""
    problems = []
    for page in sorted(site_files):
        if not re.match(r"^(notes/[^/]+\.md|labs/[^/]+/README\.md)$", page):
            continue
        for n, item in reading_items((root / page).read_text()):
            cites = (ITALIC.search(item) and YEAR.search(item)) or "et al." in item
            if cites and "http" not in item and NO_LINK not in item:
                problems.append(
                    f"{page}:{n}: cites a paper but carries no link: {item[:70]}... "
                    f"(link the title: *[Title](https://arxiv.org/abs/ID)* or "
                    f"https://doi.org/DOI; or mark the item {NO_LINK} reason -->)")
    return problems


# ---------------------------------------------------------------- the figures page


def figures_page(root, site_files):
    """Markdown of the gallery: each figure, its alt text and the pages that show it."""
    shown = {}  # figure path -> [(page, alt)]
    for page in sorted(site_files):
        if not page.endswith(".md"):
            continue
        for is_image, alt, target in links((root / page).read_text()):
            if is_image and is_relative(target):
                path = os.path.normpath(os.path.join(os.path.dirname(page), target))
                shown.setdefault(path, []).append((page, alt))
    lines = [
        "# Figures",
        "",
        "Every figure of the notes and handouts, generated from the labs' own runs by "
        "`./lab figures` (reference solutions; `./lab figures NN --student` draws the same from "
        "your code). Figures of a model (schedules, layouts, formulas) come out the same on every "
        "machine; measured ones name the machine they were measured on.",
        "",
    ]
    for fig in assets(root):
        uses = shown.get(fig, [])
        alt = uses[0][1] if uses else Path(fig).stem
        lines += [f"## {Path(fig).stem}", "", f"![{alt}]({fig})", ""]
        if uses:
            refs = ", ".join(f"[{first_heading(root / p)}]({p})" for p, _ in dict.fromkeys(uses))
            lines += [f"Shown in: {refs}.", ""]
        else:
            lines += ["Not shown by any page yet.", ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- mkdocs.yml


def navigation(root):
    titles = syllabus_titles(root)
    labs = []
    for d in lab_dirs(root):
        n = d.name[:2]
        entries = [{"Handout": f"labs/{d.name}/README.md"}]
        note = next((root / "notes").glob(f"{n}-*.md"), None)
        if note:
            entries.append({"Lecture note": f"notes/{note.name}"})
        code = [f for f in code_files(root) if f.startswith(f"labs/{d.name}/")]
        if code:
            entries.append({"Code": [{f.split("/", 2)[2]: f + ".md"} for f in code]})
        labs.append({f"{n} {titles.get(n, d.name[3:])}": entries})
    tools = [{first_heading(root / p): p} for p in
             ("notes/tools-network-and-traces.md", "notes/gpu.md") if (root / p).is_file()]
    return [
        {"Home": "README.md"},
        {"Syllabus": "labs/SYLLABUS.md"},
        {"Labs": labs},
        {"Tools": tools + [{"Figures": "figures.md"},
                           {"Runtime and harness headers": [
                               {f.split("include/", 1)[1]: f + ".md"} for f in code_files(root)
                               if not f.startswith("labs/")]}]},
        {"Instructors": [{"Anatomy of a lab": "labs/README.md"},
                         {"The autograder": "grading/README.md"}]},
    ]


def config(root, out):
    return {
        "site_name": "dtl: distributed LLM training, by doing",
        "site_description": "Twenty labs in C++ on distributed LLM training: handouts, lecture "
                            "notes and figures.",
        "docs_dir": "docs",
        "site_dir": str(out),
        # Plain file URLs (labs/04_ddp/index.html, not labs/04_ddp/): the site then works from
        # any static host without rewrite rules, and opened straight from the disk.
        "use_directory_urls": False,
        "strict": True,
        "theme": {
            "name": "material",
            "font": False,  # no Google Fonts: the site must work offline
            "features": ["navigation.sections", "navigation.top", "search.highlight",
                         "content.code.annotate"],
            "palette": {"primary": "indigo", "accent": "indigo"},
        },
        "plugins": ["search"],
        "markdown_extensions": [
            "tables", "attr_list", "admonition", "md_in_html", "footnotes",
            {"toc": {"permalink": True}},
            {"pymdownx.highlight": {"use_pygments": True}},
            "pymdownx.superfences",
        ],
        "nav": navigation(root),
    }


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument("--stage", required=True, type=Path, help="staging directory (replaced)")
    ap.add_argument("--out", required=True, type=Path, help="the built site (replaced)")
    args = ap.parse_args()
    root, stage, out = args.root.resolve(), args.stage.resolve(), args.out.resolve()

    code = set(code_files(root))
    site_files = set(pages(root)) | set(assets(root))
    problems = check_links(root, site_files | code)
    if problems:
        print("site: broken links:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    problems = check_citations(root, site_files)
    if problems:
        print("site: unlinked citations:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    problems, warnings = check_figures(root)
    if warnings:
        print("site: figures to redraw (not an error):\n  " + "\n  ".join(warnings))
    if problems:
        print("site: numbers quoted beside figures differ from the figures' data:\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 1

    shutil.rmtree(stage, ignore_errors=True)
    docs = stage / "docs"
    for rel in sorted(site_files):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".md"):
            (docs / rel).write_text(enlarge(link_code_pages(rel, (root / rel).read_text(), code)))
        else:
            shutil.copyfile(root / rel, docs / rel)
    for rel in sorted(code):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / (rel + ".md")).write_text(code_page(root, rel))
    (docs / "figures.md").write_text(enlarge(figures_page(root, site_files)))
    # JSON is YAML: no YAML writer needed.
    (stage / "mkdocs.yml").write_text(json.dumps(config(root, out), indent=1) + "\n")

    shutil.rmtree(out, ignore_errors=True)
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
             "--config-file", str(stage / "mkdocs.yml")]
    res = subprocess.run(build, cwd=stage)
    if res.returncode != 0:
        print(f"site: mkdocs failed ({res.returncode})", file=sys.stderr)
        return res.returncode
    # Debian's packages link some theme files into /usr/share/javascript: a site for any host
    # must hold real files.
    for p in out.rglob("*"):
        if p.is_symlink():
            target = p.resolve()
            p.unlink()
            shutil.copyfile(target, p)
    n_pages = sum(1 for _ in out.rglob("*.html"))
    print(f"site: {len(site_files) + 1} sources and {len(code)} code pages -> {n_pages} HTML "
          f"pages in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
