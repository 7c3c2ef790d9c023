# dtl's machine in a container: Debian 12 with exactly what `./lab setup` installs, for macOS,
# Windows and any Linux without apt. The repository is not copied in: mount your checkout
# (the dev container does, at /workspaces/dtl), so your edits stay on your disk.
#
#   docker build -t dtl .
#   docker run --rm -it --shm-size=1g -v "$PWD":/workspaces/dtl dtl ./lab grade
#   docker run --rm -it --shm-size=1g -v "$PWD":/workspaces/dtl dtl ./lab test
#
# or open the folder in VS Code with the Dev Containers extension (.devcontainer/), or in
# GitHub Codespaces: the same image.
FROM debian:12

# OpenMPI's shared-memory transport copies large messages directly between processes (CMA:
# process_vm_readv), which container runtimes may forbid (no ptrace capability). The copy-in,
# copy-out path works everywhere; dtl's numbers come from its own runs either way.
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none

# The package list lives in one place, the lab script: the image runs its `setup`. Also git
# (the dev container's source control), sudo (./lab's optional extras: figures, site) and
# ca-certificates.
COPY lab /tmp/dtl-setup/lab
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates git sudo \
 && /tmp/dtl-setup/lab setup \
 && rm -rf /var/lib/apt/lists/* /tmp/dtl-setup

# A user like the laptop's (uid 1000; the dev container maps it to yours), who may install
# ./lab's optional packages with sudo. mpirun as root works too (./lab sets OpenMPI's flags).
RUN useradd --create-home --shell /bin/bash --uid 1000 dtl \
 && echo 'dtl ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/dtl \
 && chmod 0440 /etc/sudoers.d/dtl \
 && mkdir -p /workspaces/dtl \
 && chown dtl:dtl /workspaces/dtl
USER dtl
WORKDIR /workspaces/dtl
CMD ["bash"]
