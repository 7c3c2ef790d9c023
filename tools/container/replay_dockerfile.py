#!/usr/bin/env python3
"""Check the Dockerfile where no container engine runs: replay it in a Debian root directory.

  debootstrap --variant=minbase bookworm ROOTFS http://deb.debian.org/debian
  replay_dockerfile.py --rootfs ROOTFS [--dockerfile Dockerfile] [--context .]
                       [--no-run] [--checkout] [-- COMMAND ...]

Runs the Dockerfile's instructions in order inside ROOTFS with chroot: ENV sets the environment
of what follows, COPY copies from the build context, RUN runs with /bin/sh -c as the current
USER in the current WORKDIR. FROM is the root directory itself (debootstrap of the same Debian
release: the debian:12 image is debootstrap's minbase variant of bookworm). Then, with
--checkout, the repository's tracked files are copied where the dev container mounts them
(the final WORKDIR, owned by the final USER), and COMMAND runs there as that user: e.g.
`./lab grade 01`. /proc, /sys, /dev, /dev/pts and a 1 GiB /dev/shm (docker run --shm-size=1g)
are mounted for the duration and unmounted after; /etc/resolv.conf and an /etc/hosts naming
localhost are written as a container runtime would. Needs root. Not a container: no namespaces,
no cgroups, the host's kernel and network.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


def instructions(text):
    """(KEYWORD, argument) of each instruction: continuations joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if line.strip().startswith("#") or (not line.strip() and not cur):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        key, _, arg = cur.strip().partition(" ")
        out.append((key.upper(), arg.strip()))
        cur = ""
    return out


def ids(rootfs, user):
    """(uid, gid) of `user` in the root directory's /etc/passwd."""
    if user in ("root", "0"):
        return 0, 0
    for line in (rootfs / "etc/passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == user or f[2] == user:
            return int(f[2]), int(f[3])
    raise SystemExit(f"replay: no user {user} in {rootfs}/etc/passwd")


class Mounts:
    def __init__(self, rootfs):
        self.rootfs, self.done = rootfs, []

    def __enter__(self):
        for kind, src, dst, opts in (("proc", "proc", "proc", []), ("sysfs", "sys", "sys", []),
                                     (None, "/dev", "dev", ["--bind"]),
                                     (None, "/dev/pts", "dev/pts", ["--bind"]),
                                     ("tmpfs", "shm", "dev/shm", ["-o", "size=1g"])):
            target = self.rootfs / dst
            target.mkdir(parents=True, exist_ok=True)
            cmd = ["mount"] + (["-t", kind] if kind else []) + opts + [src, str(target)]
            subprocess.run(cmd, check=True)
            self.done.append(target)
        # What a container runtime provides: the host's resolver, and an /etc/hosts that names
        # localhost (debootstrap writes none; Selenium reaches chromedriver through it).
        shutil.copyfile("/etc/resolv.conf", self.rootfs / "etc/resolv.conf")
        hosts = self.rootfs / "etc/hosts"
        if "localhost" not in (hosts.read_text() if hosts.exists() else ""):
            hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        return self

    def __exit__(self, *exc):
        for target in reversed(self.done):
            subprocess.run(["umount", "-l", str(target)], check=False)


def run(rootfs, env, user, workdir, command):
    uid, gid = ids(rootfs, user)
    environment = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   f"HOME={'/root' if uid == 0 else '/home/' + user}"]
    environment += [f"{k}={v}" for k, v in env.items()]
    script = f"cd {shlex.quote(workdir)} && {command}"
    cmd = ["chroot", f"--userspec={uid}:{gid}", "--groups=" + str(gid), str(rootfs),
           "/usr/bin/env", "-i"] + environment + ["/bin/sh", "-c", script]
    print(f"replay [{user} {workdir}] $ {command}", flush=True)
    return subprocess.run(cmd).returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", required=True, type=Path)
    ap.add_argument("--dockerfile", default="Dockerfile", type=Path)
    ap.add_argument("--context", default=".", type=Path)
    ap.add_argument("--checkout", action="store_true",
                    help="copy the repository's tracked files to the final WORKDIR")
    ap.add_argument("--no-run", action="store_true",
                    help="skip RUN and COPY (the root directory has been through them): only "
                         "take ENV, USER and WORKDIR, then --checkout and COMMAND")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("replay: needs root (chroot, mount)")
    rootfs, context = args.rootfs.resolve(), args.context.resolve()
    env, user, workdir = {}, "root", "/"
    with Mounts(rootfs):
        for key, arg in instructions(args.dockerfile.read_text()):
            if key == "FROM":
                print(f"replay: FROM {arg} = {rootfs}")
            elif key == "ENV":
                for item in shlex.split(arg):
                    k, _, v = item.partition("=")
                    env[k] = v
            elif key in ("COPY", "RUN") and args.no_run:
                print(f"replay: {key} skipped (--no-run)")
            elif key == "COPY":
                *srcs, dst = shlex.split(arg)
                for s in srcs:
                    target = rootfs / dst.lstrip("/")
                    if dst.endswith("/"):
                        target = target / Path(s).name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(context / s, target)
                    print(f"replay: COPY {s} -> {dst}")
            elif key == "RUN":
                rc = run(rootfs, env, user, workdir, arg)
                if rc != 0:
                    raise SystemExit(f"replay: RUN failed ({rc}): {arg}")
            elif key == "USER":
                user = arg
            elif key == "WORKDIR":
                workdir = arg
            elif key in ("CMD", "LABEL", "ARG", "ENTRYPOINT"):
                print(f"replay: {key} {arg} (not run)")
            else:
                raise SystemExit(f"replay: cannot replay {key}")
        if args.checkout:
            dest = rootfs / workdir.lstrip("/")
            files = subprocess.run(["git", "-C", str(context), "ls-files", "-z"], check=True,
                                   capture_output=True).stdout.split(b"\0")
            for f in filter(None, files):
                src, dst = context / f.decode(), dest / f.decode()
                if src.is_file():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
            uid, gid = ids(rootfs, user)
            subprocess.run(["chown", "-R", f"{uid}:{gid}", str(dest)], check=True)
            print(f"replay: the checkout's tracked files -> {workdir} (owner {user})")
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if command:
            rc = run(rootfs, env, user, workdir, " ".join(shlex.quote(c) for c in command))
            print(f"replay: exit status {rc}")
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
