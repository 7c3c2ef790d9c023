#!/usr/bin/env python3
"""./lab release and ./lab gradescope-zip: pack a commit of the course for students or Gradescope.

Run by tools/lab/release.sh (which builds the grader first); standard library only.

  release.py release DIR [--labs 01-07] [--publish-solutions 01-03] [--ref REF] [--allow-dirty]
  release.py gradescope-zip [OUT.zip] [--lab NN] [--ref REF] [--allow-dirty]

Both pack a commit (HEAD, or --ref), never the working tree: an edit not yet committed (a
solution pasted into a skeleton while trying it) must not reach students. Packing HEAD from a
tree with uncommitted changes or untracked files is refused unless --allow-dirty.

A student release holds the runtime, tools, handouts, notes and public tests of the chosen labs;
no solutions (but the published ones), no hidden tests, no grader self-test, Gradescope kit or
mutants. Into an empty DIR it writes a new git repository; into DIR that is the students'
repository (a clone of an earlier release) it commits the new state on top of its history, so
students `git pull` it into their own work.
"""
import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.environ.get("DTL_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_DIR = re.compile(r"^(\d\d)_")


class Refused(Exception):
    """What the user did wrong, said as ./lab says it (lab: WHAT: ...)."""


def say(msg):
    sys.stderr.write("\033[1m==> %s\033[0m\n" % msg)


def git(*args, cwd=ROOT):
    r = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise Refused("git %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def expand_labs(spec):
    """"01-03,05" -> ["01", "02", "03", "05"]."""
    found = []
    for part in (spec or "").split(","):
        part = part.replace(" ", "")
        m = re.fullmatch(r"(\d+)-(\d+)", part)
        if m:
            found += ["%02d" % k for k in range(int(m.group(1)), int(m.group(2)) + 1)]
        elif re.fullmatch(r"\d+", part):
            found.append("%02d" % int(part))
        elif part:
            raise Refused("not a lab list: '%s' (e.g. 01-07 or 01,03,05)" % spec)
    return found


def lab_dirs(tree, sub):
    """{NN: name} of TREE/SUB's NN_slug (or NN-slug) entries."""
    path = os.path.join(tree, sub)
    out = {}
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        if re.match(r"^\d\d[_-]", name):
            out.setdefault(name[:2], name)
    return out


def lab_deps(tree, n):
    """The labs whose reference lab N builds on (DEPENDS dtl_labMM_reference in its CMakeLists)."""
    name = lab_dirs(tree, "labs").get(n)
    if not name:
        return []
    try:
        text = open(os.path.join(tree, "labs", name, "CMakeLists.txt")).read()
    except OSError:
        return []
    return sorted(set(re.findall(r"dtl_lab(\d\d)_reference", text)))


def lab_closure(tree, n):
    """Lab N and every lab whose reference it builds on, directly or not."""
    seen, todo = set(), [n]
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo += lab_deps(tree, k)
    return sorted(seen)


def course_commit(what, ref, allow_dirty):
    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        raise Refused("%s: needs the course repository as a git checkout (it packs a commit)" % what)
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "-q", ref + "^{commit}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Refused("%s: no commit '%s'" % (what, ref))
    commit = r.stdout.strip()
    if not allow_dirty and commit == git("rev-parse", "HEAD").strip():
        dirty = git("status", "--porcelain").rstrip("\n").split("\n")
        if dirty != [""]:
            more = "\n..." if len(dirty) > 12 else ""
            raise Refused(
                "%s: refused: the working tree differs from %s (%s), and %s packs the commit, not the "
                "working tree:\n%s%s\nCommit (or stash) what belongs in it, or pass --allow-dirty to pack "
                "%s as committed." % (what, ref, commit[:12], what, "\n".join(dirty[:12]), more, commit[:12]))
    return commit


def export_commit(commit, dest):
    """The files of COMMIT, as committed, into DEST."""
    os.makedirs(dest, exist_ok=True)
    data = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", commit],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        t.extractall(dest, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(dest)


def describe_commit(commit):
    return git("log", "-1", "--format=%h (%cs, \"%s\")", commit).strip()


def readme_section(path, heading):
    """The section of a Markdown file that starts at the line HEADING and ends before the next
    heading of the same or a higher level (a level-1 heading: before the first section), code
    fences skipped over, table rows for instructors ("| ... instructors: ...") left out."""
    out, on, level, fence = [], False, 0, False
    for line in open(path).read().splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"^#+ ", line):
            lvl = line.index(" ")
            if on and lvl <= max(level, 2):
                break
            if line == heading:
                on, level = True, lvl
        if on and not (line.startswith("|") and "instructors:" in line):
            out.append(line)
    return out if on else None


def student_readme(tree, labs, sols, upstream):
    """The README of a student release, from tools/release/student_README.md: its
    "<!-- include: HEADING -->" lines take those sections of the course's README.md (one text for
    both, so they never drift apart); @LABS@, @SOLUTIONS@ and @UPSTREAM@ say what this release
    holds and where students pull it from. The template's leading comment is dropped."""
    template = os.path.join(tree, "tools/release/student_README.md")
    if not os.path.isfile(template):
        raise Refused("release: the commit has no %s" % template)
    lines = open(template).read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if lines and lines[0].startswith("<!--"):
        while lines and not lines[0].endswith("-->"):
            lines.pop(0)
        lines.pop(0)
    out = []
    for line in lines:
        m = re.fullmatch(r"<!-- include: (.*) -->", line)
        if m:
            section = readme_section(os.path.join(tree, "README.md"), m.group(1))
            if section is None:
                raise Refused("release: the student README template includes the section '%s', "
                              "which README.md does not have" % m.group(1))
            out += section
            continue
        out.append(line.replace("@LABS@", labs).replace("@SOLUTIONS@", sols).replace("@UPSTREAM@", upstream))
    return "\n".join(out) + "\n"


def keep_in_release(path, labs, pub):
    """Whether a file of the commit goes into a student release of LABS with solutions PUB."""
    def nn(prefix):
        return path[len(prefix):len(prefix) + 2]
    if re.match(r"^labs/\d\d_", path):
        return nn("labs/") in labs
    if re.match(r"^solutions/\d\d_", path):
        return nn("solutions/") in pub
    if path.startswith("solutions/") or path.startswith("tools/release/"):
        return False
    if re.match(r"^grading/\d\d_[^/]*/rubric\.json$", path):
        return nn("grading/") in labs
    if re.match(r"^grading/(\d\d_|selftest/|gradescope/|mutants/)", path) or path == "grading/release_check.sh":
        return False
    if re.match(r"^notes/\d\d-", path):
        return nn("notes/") in labs
    return True


def cmd_release(args, grader):
    if not args.dir:
        raise Refused("release: where to? (./lab release DIR [--labs 01-07] [--publish-solutions 01-03] [--ref REF])")
    commit = course_commit("release", args.ref, args.allow_dirty)
    dest = args.dir
    with tempfile.TemporaryDirectory(prefix="dtl-release-") as stage:
        tree, out = os.path.join(stage, "course"), os.path.join(stage, "release")
        export_commit(commit, tree)
        all_labs = sorted(lab_dirs(tree, "labs"))
        labs = expand_labs(args.labs) if args.labs else all_labs
        pub = expand_labs(args.publish_solutions)
        for n in labs:
            if n not in all_labs:
                raise Refused("release: commit %s has no lab %s (labs: %s)" % (commit[:12], n, " ".join(all_labs)))
        for n in pub:
            if n not in labs:
                raise Refused("release: --publish-solutions %s, but lab %s is not released (--labs)" % (n, n))
        # A lab built on an earlier lab's reference needs that reference's source: publish it (the
        # usual week-by-week order: lab 05 is released after lab 04's deadline).
        for n in labs:
            for m in lab_deps(tree, n):
                if m not in labs or m not in pub:
                    raise Refused("release: lab %s builds on lab %s's reference solution: release lab %s and "
                                  "publish its solution (--publish-solutions %s), or leave lab %s out" % (n, m, m, m, n))
        # Where it goes: a new repository, or the next commit of the students' repository.
        mode, old_labs, old_pub, upstream = "new", [], [], "<URL-of-this-repository>"
        entries = sorted(os.listdir(dest)) if os.path.isdir(dest) else []
        if entries == [".git"] and subprocess.run(["git", "-C", dest, "rev-parse", "-q", "--verify", "HEAD"],
                                                  capture_output=True).returncode != 0:
            mode = "empty-clone"  # a clone of the students' repository, made empty on the forge
        elif os.path.exists(dest) and (entries or not os.path.isdir(dest)):
            top = subprocess.run(["git", "-C", dest, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
            if not (top.returncode == 0 and top.stdout.strip() == os.path.realpath(dest)
                    and os.path.isfile(os.path.join(dest, "lab"))
                    and os.path.isfile(os.path.join(dest, "labs/SYLLABUS.md"))):
                raise Refused("release: %s is neither empty nor a student repository (a clone of an earlier release)" % dest)
            if git("status", "--porcelain", cwd=dest).strip():
                raise Refused("release: %s has uncommitted changes; commit or discard them first (a release "
                              "replaces its files and commits)" % dest)
            old_labs = sorted(lab_dirs(dest, "labs"))
            old_pub = sorted(lab_dirs(dest, "solutions"))
            # Students have work in every lab they got: a release never takes a lab back.
            for n in old_labs:
                if n not in labs:
                    raise Refused("release: lab %s is in %s already and not in --labs: students would lose "
                                  "it on their next pull; release it again" % (n, dest))
            mode = "update"
        if grader is None:
            return  # --check-only: every refusal above comes before anything is built
        # The files: the commit's, filtered.
        files = [f for f in git("ls-tree", "-r", "-z", "--name-only", commit).split("\0")
                 if f and keep_in_release(f, labs, pub)]
        for f in files:
            src, dst = os.path.join(tree, f), os.path.join(out, f)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        slugs = lab_dirs(tree, "labs")
        for n in labs:
            rubric = subprocess.run([grader, "--public-rubric", os.path.join(tree, "grading", slugs[n], "rubric.json")],
                                    capture_output=True, text=True)
            if rubric.returncode != 0:
                raise Refused("release: lab %s's rubric: %s" % (n, rubric.stderr.strip()))
            open(os.path.join(out, "grading", slugs[n], "rubric.json"), "w").write(rubric.stdout)
        # The syllabus still lists every lecture; labs not in this release say so, without links
        # to the handout and note the release does not have.
        syllabus = os.path.join(out, "labs/SYLLABUS.md")
        text = open(syllabus).read().split("\n")
        for i, line in enumerate(text):
            m = re.match(r"^\| (\d\d) \|", line)
            if m and m.group(1) in all_labs and m.group(1) not in labs:
                line = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", line)
                line = re.sub(r"^(\|.*\| )available \|$", r"\1not released yet |", line)
                text[i] = line
        open(syllabus, "w").write("\n".join(text))
        sols = "; the reference solutions of labs %s are in `solutions/`" % " ".join(pub) if pub else ""
        # Where students pull from: the students' repository's own remote, when it has one.
        if mode != "new":
            r = subprocess.run(["git", "-C", dest, "remote", "get-url", "origin"], capture_output=True, text=True)
            upstream = r.stdout.strip() if r.returncode == 0 else upstream
        open(os.path.join(out, "README.md"), "w").write(student_readme(tree, " ".join(labs), sols, upstream))
        # Into the repository.
        if mode == "new":
            os.makedirs(dest, exist_ok=True)
            git("init", "-q", "-b", "main", cwd=dest)
        elif mode == "update":
            git("rm", "-rq", ".", cwd=dest)
        git_id = []
        if not subprocess.run(["git", "-C", dest, "config", "user.email"], capture_output=True, text=True).stdout.strip():
            git_id = ["-c", "user.name=dtl", "-c", "user.email=dtl@localhost"]
        shutil.copytree(out, dest, symlinks=True, dirs_exist_ok=True)
        git("add", "-A", cwd=dest)
    if mode == "update" and subprocess.run(["git", "-C", dest, "diff", "--cached", "--quiet"]).returncode == 0:
        say("release: %s already holds exactly this release (labs %s; commit %s): nothing to commit"
            % (dest, " ".join(labs), commit[:12]))
        return
    # The commit says what changed: new labs, newly published solutions, updated files.
    new_labs = [n for n in labs if n not in old_labs] if mode == "update" else []
    new_pub = [n for n in pub if n not in old_pub] if mode == "update" else []
    changed = []
    if mode == "update":
        for line in git("diff", "--cached", "--name-status", "--no-renames", cwd=dest).splitlines():
            status, path = line.split("\t", 1)
            news = {"labs/": new_labs, "grading/": new_labs, "notes/": new_labs, "solutions/": new_pub}
            if any(re.match(r"^%s\d\d[_-]" % p, path) and path[len(p):len(p) + 2] in ns for p, ns in news.items()):
                continue
            changed.append("  %s %s" % (status, path))
    if mode != "update":
        subject = "dtl student release: labs %s%s" % (" ".join(labs), ", solutions " + " ".join(pub) if pub else "")
    else:
        parts = []
        if new_labs:
            parts.append(" new lab(s) %s;" % " ".join(new_labs))
        if new_pub:
            parts.append(" solution(s) of %s;" % " ".join(new_pub))
        if changed:
            parts.append(" %d file(s) updated;" % len(changed))
        subject = ("dtl release:" + "".join(parts)).rstrip(";")
    body = "Labs: %s%s" % (" ".join(labs), " (new: %s)" % " ".join(new_labs) if new_labs else "")
    if pub:
        body += "\nReference solutions: %s%s" % (" ".join(pub), " (new: %s)" % " ".join(new_pub) if new_pub else "")
    if changed:
        body += "\n\nUpdated since the last release (M changed, A added, D removed):\n" + "\n".join(changed[:40])
        if len(changed) > 40:
            body += "\n  ... and %d more" % (len(changed) - 40)
    if mode == "update":
        body += '\n\nStudents: git pull (README.md, "Getting the next labs").'
    body += "\n\nCourse-commit: " + commit
    subprocess.run(["git", "-C", dest, *git_id, "commit", "-q", "-m", subject, "-m", body], check=True)
    say("release: the %s of the student repository %s" % ("next commit" if mode == "update" else "first commit", dest))
    err = sys.stderr.write
    err("  labs:      %s%s\n" % (" ".join(labs), " (new: %s)" % " ".join(new_labs) if new_labs else ""))
    err("  solutions: %s%s\n" % (" ".join(pub) or "none", " (new: %s)" % " ".join(new_pub) if new_pub else ""))
    if mode == "update":
        err("  updated:   %d file(s) besides the new labs (git -C %s show --stat)\n" % (len(changed), dest))
    err("  from:      course commit %s\n" % describe_commit(commit))
    err("  commit:    %s on %s (%d files); publish it: git -C %s push\n" % (
        git("rev-parse", "--short", "HEAD", cwd=dest).strip(), git("branch", "--show-current", cwd=dest).strip(),
        len(git("ls-files", cwd=dest).splitlines()), dest))


def cmd_gradescope_zip(args):
    """The Gradescope autograder: a commit of this repository plus setup.sh and run_autograder at
    the zip's root, where Gradescope looks for them. With --lab NN, the autograder of one
    assignment: lab NN's handout, tests, hidden tests and reference, and the labs whose references
    it builds on (the trusted driver runs the reference's build of the tests), nothing of any
    other lab; the lab is pinned in grading/gradescope/settings, which run_autograder reads."""
    lab = "%02d" % int(args.lab) if args.lab else ""
    out = os.path.abspath(args.out or os.path.join(ROOT, "dtl-autograder%s.zip" % ("-lab" + lab if lab else "")))
    commit = course_commit("gradescope-zip", args.ref, args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix="dtl-autograder-") as stage:
        export_commit(commit, stage)
        what = "every lab, chosen by the submission's file names"
        if lab:
            if not os.path.isfile(os.path.join(stage, "grading", lab_dirs(stage, "grading").get(lab, "-"), "rubric.json")):
                raise Refused("gradescope-zip: lab %s has no rubric (grading/%s_*/rubric.json) in %s" % (lab, lab, commit[:12]))
            keep = lab_closure(stage, lab)
            for sub in ("labs", "solutions", "notes"):
                for n, name in lab_dirs(stage, sub).items():
                    if n not in keep:  # a lab's folder, or a note's file
                        path = os.path.join(stage, sub, name)
                        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            for n, name in lab_dirs(stage, "grading").items():
                if n != lab:
                    shutil.rmtree(os.path.join(stage, "grading", name))
            with open(os.path.join(stage, "grading/gradescope/settings"), "w") as f:
                f.write("# Written by ./lab gradescope-zip --lab %s: the lab this autograder grades.\nlab=%s\n" % (lab, lab))
            deps = [k for k in keep if k != lab]
            what = "lab %s%s" % (lab, ", with the reference solutions of lab(s) %s, which it builds on" % " ".join(deps)
                                 if deps else "")
        shutil.rmtree(os.path.join(stage, "grading/mutants"), ignore_errors=True)  # the instructors' wrong versions
        for f in ("setup.sh", "run_autograder"):
            shutil.copy2(os.path.join(stage, "grading/gradescope", f), os.path.join(stage, f))
        if os.path.exists(out):
            os.remove(out)
        # Zip entries keep their Unix modes (run_autograder and setup.sh stay executable).
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for dirpath, dirnames, filenames in os.walk(stage):
                dirnames.sort()
                for name in sorted(filenames):
                    path = os.path.join(dirpath, name)
                    z.write(path, os.path.relpath(path, stage))
    say("wrote " + out)
    sys.stderr.write("  grades:    %s\n" % what)
    sys.stderr.write("  from:      course commit %s\n" % describe_commit(commit))
    sys.stderr.write("  upload it as the autograder of %s (base image: Debian 12 or Ubuntu 24.04; grading/README.md, "
                     "\"Gradescope\")\n" % ("lab %s's assignment" % lab if lab else "an assignment that takes any lab"))


def main(argv):
    p = argparse.ArgumentParser(prog="./lab", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("release")
    r.add_argument("dir", nargs="?")
    r.add_argument("--labs")
    r.add_argument("--publish-solutions")
    r.add_argument("--grader", help="dtl-grade (its --public-rubric)")
    r.add_argument("--check-only", action="store_true", help="the refusals only, before the grader is built")
    g = sub.add_parser("gradescope-zip")
    g.add_argument("out", nargs="?")
    g.add_argument("--lab")
    for q in (r, g):
        q.add_argument("--ref", default="HEAD")
        q.add_argument("--allow-dirty", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.cmd == "release":
            if not args.check_only and not args.grader:
                raise Refused("release: --grader or --check-only")
            cmd_release(args, None if args.check_only else args.grader)
        else:
            cmd_gradescope_zip(args)
    except Refused as e:
        sys.stderr.write("lab: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
