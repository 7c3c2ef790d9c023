#!/usr/bin/env bash
# Gradescope autograder setup (runs once, as root, when the autograder image is built).
# Upload a zip of this repository as the autograder; Gradescope unpacks it to
# /autograder/source. Choose a Debian 12 or Ubuntu 24.04 base image (for libtorch-dev).
set -euxo pipefail
cd /autograder/source
./lab setup                 # the Debian packages dtl needs
./lab build                 # everything, so grading a submission only rebuilds its lab
# Student code runs as this unprivileged user, never as root.
id -u student >/dev/null 2>&1 || useradd --create-home --shell /usr/sbin/nologin student
chmod -R a+rX /autograder/source
