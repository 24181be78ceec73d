#!/usr/bin/env bash
# The launcher of jobs' containers, installed as /usr/local/sbin/gpufleet-container (root's, 0755). Jobs are not in
# the docker group (root on the host): they start containers only through this program, which every user may run as
# root through sudo and nothing else (/etc/sudoers.d/gpufleet-container). It hands its arguments to
# `python -m trainer container` (trainer.node.container): `run` reads a request (JSON) on stdin and starts only the
# hardened `docker run` for the caller (sudo's SUDO_UID/SUDO_GID), `stop NAME --time N` stops only a container of
# the caller's. Nothing of the caller reaches that Python but the two ids: the trainer's virtualenv interpreter in
# isolated mode (-I: no PYTHON* variables, no user site, not the caller's directory on sys.path), run from / with an
# environment of its own.
# Usage: sudo -n /usr/local/sbin/gpufleet-container run|stop NAME --time N
set -euo pipefail

python=/opt/gpufleet/venv/bin/python # the manifest's .trainer.venv (tests/ami check that they agree)

if [ "$EUID" -ne 0 ]; then
  echo "gpufleet-container: must run as root (through sudo: sudo -n /usr/local/sbin/gpufleet-container ...)" >&2
  exit 2
fi
cd /
keep=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
[ -z "${SUDO_UID:-}" ] || keep+=("SUDO_UID=$SUDO_UID")
[ -z "${SUDO_GID:-}" ] || keep+=("SUDO_GID=$SUDO_GID")
exec env -i "${keep[@]}" "$python" -I -m trainer container "$@"
