#!/usr/bin/env bash
# Gradescope autograder setup (runs once, as root, when the autograder image is built).
# Make the zip with `./lab gradescope-zip`; Gradescope unpacks it to /autograder/source and runs
# this file from there. Base image: Debian 12 or Ubuntu 24.04 (for libtorch-dev).
set -euxo pipefail
src=${DTL_AUTOGRADER_SOURCE:-/autograder/source}
user=${DTL_AUTOGRADER_USER:-student}
cd "$src"
./lab setup                 # the Debian packages dtl needs
./lab build                 # everything, so grading a submission only rebuilds its lab
# The reference solutions, graded once: proves the image works, and records each lab's time
# (build/reference-times.json), from which a submission's time budget is derived.
./lab grade --solutions --no-perf --json /tmp/reference-results.json
# Student code runs as this unprivileged user, never as root; it may not read the solutions,
# the hidden tests or anything else of this directory.
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /usr/sbin/nologin "$user"
chmod -R go-rwx "$src"
