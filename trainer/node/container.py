"""`python -m trainer container run|stop|job`: containers for jobs that are not in the docker group.

The docker group is root on the host (`docker run --privileged -v /:/host` is one command away), so no job's user
is in it. A job starts its container through this launcher instead, the one way to the daemon it has: on a node
``/usr/local/sbin/gpufleet-container`` runs it as root through sudo (a sudoers rule lets every user run that one
program, nothing else), and it starts only what :func:`trainer.node.runner.docker_argv` renders for the caller:

- the container runs as the caller's uid and gid (sudo's ``SUDO_UID``/``SUDO_GID``; nobody for root), every
  capability dropped but IPC_LOCK where InfiniBand wants it, no new privileges, Docker's default seccomp; on
  host network the metadata service does not answer that uid (the image's packet filter, trainer.node.jobcreds);
- the request (JSON on stdin: argv shows in sudo's log and ``ps``, values must not) names the image, its command,
  the job's environment and directories; it cannot name a docker option, a mount or a device. The two
  directories it mounts (scratch and control) are the caller's own directories, checked without following a link;
  extra docker flags (the tests' mounts of the host's Python) are taken from root only;
- a registry login in the request goes to a config directory of the launcher's own (0700, root's), used for the
  pull and removed before the container starts: the job's directories are never read by the privileged side;
- `stop` stops only a container of the caller's (its label names the uid that started it).

`job IMAGE [CMD...]` is the unprivileged side for a user's own sbatch script (``gpufleet-docker-run``): a scratch
directory of its own, the job's credentials by name, and the launcher through sudo; SIGTERM stops the container.
"""
from __future__ import annotations

import json
import logging
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from argparse import REMAINDER
from pathlib import Path

from trainer.errors import ArgumentParser, UsageError
from trainer.jobs.spec import schema
from trainer.node.registry import RegistryLogin, write_config_dir
from trainer.node.runner import (CONTAINER_ENV_FILE, SCRATCH, NodeFacts, Running, container_user, docker_argv,
                                 loggable, node_facts, stop_grace)

log = logging.getLogger("gpufleet.container")

LAUNCHER = "/usr/local/sbin/gpufleet-container"  # root's, run through sudo (ami/files/gpufleet-container.sh)
LAUNCHER_VARIABLE = "GPUFLEET_CONTAINER_LAUNCHER"  # a box's own launcher (infra.box.layout), where it is not LAUNCHER
NODE_JSON = Path("/etc/gpufleet/node.json")
UID_LABEL = "gpufleet.uid"                     # the uid that started a container: who may stop it
MAX_REQUEST = 1 << 20                          # bytes of JSON on stdin
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_IMAGE = re.compile(schema()["properties"]["image"]["pattern"])  # the job spec's: [registry/]name[:tag][@digest]
# botocore's container credentials: a job's host process has them from the TaskProlog; a container is given them
CREDENTIALS_URI, CREDENTIALS_TOKEN = "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN"
CREDENTIALS_NAMES = (CREDENTIALS_URI, CREDENTIALS_TOKEN)
DOCKER_ENV = ("PATH", "DOCKER_HOST", "LANG")    # what of the launcher's environment its docker commands get


def launcher_argv() -> list[str]:
    """How the task reaches the launcher: through sudo (non-interactive) unless it already is root (a test run by
    root), where it runs the launcher's module with this Python. A box names its own launcher (LAUNCHER_VARIABLE),
    which its sudoers rule names: the variable chooses only what sudo is asked for."""
    if os.getuid() == 0:
        return [sys.executable, "-m", "trainer", "container"]
    return ["sudo", "-n", os.environ.get(LAUNCHER_VARIABLE) or LAUNCHER]


def caller() -> tuple[int, int]:
    """Who asked: the user sudo ran the launcher for (its SUDO_UID/SUDO_GID, which sudo sets and the caller cannot),
    else this process's own user."""
    if os.getuid() == 0 and os.environ.get("SUDO_UID", "").isdigit() and os.environ.get("SUDO_GID", "").isdigit():
        return int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    return os.getuid(), os.getgid()


# --- the request --------------------------------------------------------------------------------------------------

def make_request(name: str, image: str, command: list[str], env: dict[str, str], secret_names: tuple[str, ...],
                 gpus: int | None, node_gpus: int, grace_s: int, control_dir: str | None, scratch_dir: str,
                 login: RegistryLogin | None = None, extra: tuple[str, ...] = ()) -> dict:
    """The launcher's request (JSON on its stdin)."""
    return {"name": name, "image": image, "command": list(command), "env": dict(env),
            "secret_names": list(secret_names), "gpus": gpus, "node_gpus": node_gpus, "grace_s": grace_s,
            "control_dir": control_dir, "scratch_dir": scratch_dir, "extra": list(extra),
            "login": None if login is None else {"host": login.host, "username": login.username,
                                                 "password": login.password}}


def _want(ok: bool, what: str) -> None:
    if not ok:
        raise UsageError(f"container: {what}")


def check_request(req, who: tuple[int, int]) -> dict:
    """The request as the launcher uses it, or a UsageError naming the first thing wrong (pure but for the two
    directories' lstat)."""
    _want(isinstance(req, dict), "the request is not a JSON object")
    known = {"name", "image", "command", "env", "secret_names", "gpus", "node_gpus", "grace_s", "control_dir",
             "scratch_dir", "extra", "login"}
    _want(not set(req) - known, f"unknown request keys {sorted(set(req) - known)}")
    name, image = req.get("name"), req.get("image")
    _want(isinstance(name, str) and bool(_NAME.fullmatch(name)), f"bad container name {name!r}")
    _want(isinstance(image, str) and len(image) <= 255 and bool(_IMAGE.fullmatch(image)),
          f"bad image reference {image!r}")
    command = req.get("command", [])
    _want(isinstance(command, list) and all(isinstance(a, str) and "\0" not in a for a in command),
          "the command is not a list of strings")
    env = req.get("env", {})
    _want(isinstance(env, dict) and all(isinstance(k, str) and _ENV_NAME.fullmatch(k) for k in env),
          f"bad env names {sorted(k for k in env if not _ENV_NAME.fullmatch(str(k)))}" if isinstance(env, dict)
          else "env is not an object")
    _want(all(isinstance(v, str) and "\0" not in v for v in env.values()), "env values are not strings")
    secrets = req.get("secret_names", [])
    _want(isinstance(secrets, list) and all(s in env for s in secrets), "secret names not in env")
    for key in ("node_gpus", "grace_s"):
        _want(isinstance(req.get(key), int) and 0 <= req[key] <= 100_000, f"{key} is not a count")
    gpus = req.get("gpus")
    _want(gpus is None or (isinstance(gpus, int) and 0 <= gpus <= 1024), "gpus is not a count")
    extra = req.get("extra", [])
    _want(isinstance(extra, list) and all(isinstance(a, str) for a in extra), "extra is not a list of strings")
    _want(not extra or who[0] == 0, "extra docker flags are root's only")
    login = req.get("login")
    _want(login is None or (isinstance(login, dict) and set(login) == {"host", "username", "password"}
                            and all(isinstance(v, str) for v in login.values())), "bad registry login")
    for key in ("scratch_dir", "control_dir"):
        if key == "control_dir" and req.get(key) is None:
            continue
        _own_dir(req.get(key), key, who)
    return {"name": name, "image": image, "command": command, "env": env, "secret_names": tuple(secrets),
            "gpus": gpus, "node_gpus": req["node_gpus"], "grace_s": req["grace_s"],
            "control_dir": req.get("control_dir"), "scratch_dir": req["scratch_dir"], "extra": tuple(extra),
            "login": None if login is None else RegistryLogin(login["host"], login["username"], login["password"],
                                                              0.0)}


def _own_dir(path, key: str, who: tuple[int, int]) -> None:
    """A directory of the caller's: absolute, normalised, not a link, owned by the caller (root may name any)."""
    _want(isinstance(path, str) and os.path.isabs(path) and os.path.normpath(path) == path and ":" not in path
          and "," not in path, f"{key} {path!r} is not an absolute, normalised path")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UsageError(f"container: {key} {path}: {exc.strerror}") from None
    _want(stat.S_ISDIR(st.st_mode), f"{key} {path} is not a directory (a link is not followed)")
    _want(who[0] == 0 or st.st_uid == who[0], f"{key} {path} is not the caller's (owner uid {st.st_uid})")


def container_name(uid: int, name: str) -> str:
    return f"gpufleet-{uid}-{name}"


def run_argv(req: dict, who: tuple[int, int], facts: NodeFacts, env_file: bool, memlock: str = "-1:-1") -> list[str]:
    """The `docker run` the launcher starts for a checked request (pure): as the caller, labelled with its uid."""
    user = "{}:{}".format(*container_user(*who))
    argv = docker_argv(container_name(who[0], req["name"]), req["image"], req["command"], req["env"], facts,
                       req["gpus"], req["control_dir"], req["grace_s"], user, req["scratch_dir"],
                       req["secret_names"], container_env_file=env_file, extra=req["extra"], memlock=memlock)
    return [*argv[:2], "--label", f"{UID_LABEL}={who[0]}", *argv[2:]]


def memlock_limit() -> str:
    """Locked memory for containers: unlimited (what NCCL over EFA or InfiniBand wants) where this host lets root
    raise it, as on a node; else the launcher's own limits (a sandbox without CAP_SYS_RESOURCE, where docker would
    fail to set more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return "-1:-1"
    except (ValueError, OSError):
        return f"{soft}:{hard}".replace(str(resource.RLIM_INFINITY), "-1")


def _node() -> dict:
    try:
        return json.loads(NODE_JSON.read_text())
    except (OSError, ValueError):
        return {}


# --- the privileged side ------------------------------------------------------------------------------------------

def serve_run(stdin, who: tuple[int, int]) -> int:
    """Reads a request, pulls its image with its login (if any), then becomes `docker run`."""
    raw = stdin.read(MAX_REQUEST + 1)
    _want(len(raw) <= MAX_REQUEST, f"the request is over {MAX_REQUEST} bytes")
    try:
        req = check_request(json.loads(raw), who)
    except ValueError as exc:  # not JSON, not UTF-8
        raise UsageError(f"container: the request is not JSON ({exc})") from None
    facts = node_facts(_node(), None, req["node_gpus"])
    argv = run_argv(req, who, facts, Path(CONTAINER_ENV_FILE).exists(), memlock_limit())
    env = {k: v for k, v in os.environ.items() if k in DOCKER_ENV}
    if req["login"] is not None:
        config = Path(tempfile.mkdtemp(prefix="gpufleet-login-"))
        try:
            write_config_dir(config, [req["login"]])
            log.info("pulling %s with the job's registry login", req["image"])
            pulled = subprocess.run(["docker", "pull", "--quiet", req["image"]], env={**env, "DOCKER_CONFIG":
                                    str(config)}, stdout=subprocess.DEVNULL)
        finally:
            shutil.rmtree(config, ignore_errors=True)
        if pulled.returncode != 0:
            return pulled.returncode
        argv = [*argv[:2], "--pull", "never", *argv[2:]]
    log.info("running %s for uid %d", " ".join(loggable(argv, req["command"])), who[0])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, {**env, **{k: req["env"][k] for k in req["secret_names"]}})


def serve_stop(name: str, grace_s: int, who: tuple[int, int]) -> int:
    """`docker stop` of a container the caller started (root: any job's)."""
    _want(bool(re.fullmatch(r"gpufleet-[0-9]+-" + _NAME.pattern, name)), f"bad container name {name!r}")
    env = {k: v for k, v in os.environ.items() if k in DOCKER_ENV}
    label = "{{index .Config.Labels \"%s\"}}" % UID_LABEL
    found = subprocess.run(["docker", "container", "inspect", "--format", label, name], env=env, capture_output=True,
                           text=True)
    if found.returncode != 0:
        raise UsageError(f"container: no container {name}")
    owner = found.stdout.strip()
    _want(who[0] == 0 or owner == str(who[0]), f"{name} is not a container of uid {who[0]}")
    return subprocess.run(["docker", "stop", "--time", str(grace_s), name], env=env,
                          stdout=subprocess.DEVNULL).returncode


# --- the unprivileged side ----------------------------------------------------------------------------------------

class ContainerRun(Running):
    """A job's container through the launcher, in the foreground; a stop is the stop file and the launcher's
    `docker stop --time GRACE` (SIGTERM to the container's init, SIGKILL after the grace)."""

    def __init__(self, proc: subprocess.Popen, name: str, stop_file: Path | None):
        super().__init__(proc, stop_file)
        self.name = name  # the container's, as the launcher named it

    def stop(self, grace_s: int) -> None:
        self.stop_requested = True
        self.signal_stop()
        threading.Thread(target=self._docker_stop, args=(grace_s,), name="docker-stop", daemon=True).start()

    def _docker_stop(self, grace_s: int) -> None:
        done = subprocess.run([*launcher_argv(), "stop", self.name, "--time", str(grace_s)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0 and self.proc.poll() is None:
            log.warning("docker stop %s: %s", self.name, done.stderr.strip())


def start(request: dict, stop_file: Path | None, spawn=subprocess.Popen) -> ContainerRun:
    """The launcher started (``spawn(argv, **kw)``: a Popen) on ``request``, written to its stdin, then closed."""
    proc = spawn([*launcher_argv(), "run"], stdin=subprocess.PIPE)
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:  # the launcher refused before reading it all: its exit status says why
        pass
    return ContainerRun(proc, container_name(os.getuid(), request["name"]), stop_file)


# --- a user's own sbatch script ----------------------------------------------------------------

def run_job(image: str, command: list[str]) -> int:
    """A container for a user's own batch script: a scratch directory of its own (removed after), the job's
    credentials passed on by name, the job's GPUs; SIGTERM (Slurm's stop) stops the container within its grace."""
    shared = Path(SCRATCH) / "jobs"
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=shared if shared.is_dir() else None))
    node = _node()
    name = f"sbatch-{os.environ.get('SLURM_JOB_ID', 'local')}-{os.getpid()}"
    env = {k: os.environ[k] for k in CREDENTIALS_NAMES if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("GPUFLEET_") and k != "GPUFLEET_SCRATCH"})
    env["GPUFLEET_SCRATCH"] = SCRATCH
    grace = stop_grace(node.get("cloud"))
    gpus = len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]) or None
    req = make_request(name, image, command, env, tuple(k for k in CREDENTIALS_NAMES if k in env), gpus,
                       gpus or 0, grace, None, str(scratch))
    try:
        run = start(req, None)
        signal.signal(signal.SIGTERM, lambda signum, frame: run.stop(grace))
        return run.wait()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer container",
                       description="Containers for jobs outside the docker group: the launcher sudo runs as root "
                                   "(run, stop) and its client for a user's batch script (job).")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("run", help="read a request (JSON) on stdin and become its `docker run` (the launcher)")
    s = sub.add_parser("stop", help="stop a container the caller started (the launcher)")
    s.add_argument("name", help="the container's name, gpufleet-<uid>-<name>")
    s.add_argument("--time", type=int, default=10, help="seconds from SIGTERM to SIGKILL (default %(default)s)")
    j = sub.add_parser("job", help="a container for a user's batch script, through the launcher")
    j.add_argument("image", help="the image reference (no docker options)")
    j.add_argument("command", nargs=REMAINDER, help="the container's command and its arguments")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.action == "run":
        return serve_run(sys.stdin.buffer, caller())
    if args.action == "stop":
        return serve_stop(args.name, args.time, caller())
    return run_job(args.image, args.command)
