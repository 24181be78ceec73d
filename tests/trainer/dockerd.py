"""A real Docker daemon for the tests (Debian's docker.io) on a private socket and data root, and the example
image built on it from a local base: no registry is contacted.

The base image is a root filesystem made here and `docker import`ed: /bin/sh and the system libraries that
the host's Python, torch and the other compiled packages link against, nothing else. Python itself is not
copied in (a full torch under the vfs driver is gigabytes per container): the tests' containers get the host's
Python prefix and virtualenv bind-mounted read-only at the same paths (:func:`host_python_flags`, extra
`docker run` flags the per-node task takes for tests; the production argv has none). The image is then built from
examples/Dockerfile on that base, so the tests run the Dockerfile and the script users get.
"""
from __future__ import annotations

import contextlib
import io
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "gpufleet-test/base:1"
EXAMPLE_IMAGE = "gpufleet-test/example:1"
PREFIX = Path(sys.base_prefix).resolve()    # the host's Python installation
VENV = Path(sys.prefix)                      # the virtualenv the tests run in (torch, boto3, ...)
GUARD_DIR = ROOT / "tests" / "loopback_only"


class Dockerd:
    def __init__(self, root: Path):
        self.root = root
        self.socket = root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "Dockerd":
        log = open(self.root / "dockerd.log", "w")
        self.proc = subprocess.Popen(
            ["dockerd", "--host", self.host, "--data-root", str(self.root / "data"), "--exec-root",
             str(self.root / "exec"), "--pidfile", str(self.root / "docker.pid"), "--storage-driver", "vfs",
             "--iptables=false", "--bridge=none"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited {self.proc.returncode}: {(self.root / 'dockerd.log').read_text()}")
            if self.socket.exists() and self.docker("version", check=False).returncode == 0:
                return self
            time.sleep(0.2)
        raise RuntimeError("dockerd did not answer within the timeout")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, check=check, **kw)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for line in Path("/proc/mounts").read_text().splitlines():  # dockerd leaves its netns mount behind
            where = line.split()[1]
            if where.startswith(f"{self.root}/"):
                subprocess.run(["umount", "-l", where], check=False)


def _libraries() -> set[Path]:
    """The system libraries (outside the Python prefix and venv) that Python, its extension modules and the
    venv's compiled packages load, with the dynamic loader."""
    objects = [Path(os.path.realpath(sys.executable)), Path("/bin/dash")]
    for top in (Path(os.__file__).parent / "lib-dynload", Path(sysconfig.get_paths()["purelib"])):
        objects += [p for p in top.rglob("*.so*") if p.is_file()]
    found: set[Path] = {Path("/lib64/ld-linux-x86-64.so.2")}
    for i in range(0, len(objects), 200):
        out = subprocess.run(["ldd", *map(str, objects[i:i + 200])], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if "=> /" in line:
                lib = Path(line.split("=> ", 1)[1].split(" (", 1)[0])
                if not str(lib).startswith((str(PREFIX), str(VENV))):
                    found.add(lib)
    return found


def rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for d in ("bin", "etc", "lib", "lib64", "usr", "usr/bin", "usr/lib", "root", "app", "proc", "sys", "dev"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        add_file("bin/sh", Path("/bin/dash").read_bytes(), 0o755)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\n")
        dirs = set()
        for lib in sorted(_libraries()):
            parent = lib.parent.as_posix().lstrip("/")
            for i in range(len(Path(parent).parts)):
                d = "/".join(Path(parent).parts[: i + 1])
                if d not in dirs and d not in ("lib", "lib64", "usr", "usr/lib"):
                    dirs.add(d)
                    add_dir(d)
            add_file(lib.as_posix().lstrip("/"), Path(os.path.realpath(lib)).read_bytes(), 0o755)
    return buf.getvalue()


def build_example_image(d: Dockerd, work: Path) -> None:
    """The base from the root filesystem, then examples/Dockerfile on it (the trainer package and the script)."""
    subprocess.run(["docker", "import", "-", BASE_IMAGE], input=rootfs_tar(), env=d.env, check=True,
                   capture_output=True)
    context = work / "context"
    shutil.copytree(ROOT / "trainer", context / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    (context / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "train.py", context / "examples" / "train.py")
    d.docker("build", "-q", "-f", str(ROOT / "examples" / "Dockerfile"), "--build-arg", f"BASE={BASE_IMAGE}",
             "--build-arg", "PIP_INSTALL=", "-t", EXAMPLE_IMAGE, str(context))


def sandbox_flags() -> tuple[str, ...]:
    """This machine may not raise locked memory beyond its own limit (no CAP_SYS_RESOURCE), so the production
    `--ulimit memlock=-1:-1` is overridden (docker keeps the last value per limit) with the current one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard == resource.RLIM_INFINITY:
        return ()
    return ("--ulimit", f"memlock={soft}:{hard}")


def host_python_flags(extra_env: dict[str, str] | None = None) -> tuple[str, ...]:
    """Test-only `docker run` flags: the host's Python and venv read-only at their own paths, the loopback guard
    first on PYTHONPATH (its log writable), and the tests' AWS settings (moto server, fake credentials)."""
    flags = ["--volume", f"{PREFIX}:{PREFIX}:ro", "--volume", f"{VENV}:{VENV}:ro",
             "--env", f"PATH={VENV}/bin:/usr/bin:/bin"]
    guard_log = os.environ.get("GPUFLEET_LOOPBACK_LOG")  # set under pytest; the benchmarks run without the guard
    if guard_log:
        log_dir = Path(guard_log).parent
        log_dir.chmod(0o1777)  # containers run as nobody when the tests run as root
        flags += ["--volume", f"{GUARD_DIR}:/guard:ro", "--volume", f"{log_dir}:{log_dir}",
                  "--env", f"GPUFLEET_LOOPBACK_LOG={guard_log}"]
    flags += ["--env", f"PYTHONPATH={'/guard:' if guard_log else ''}/opt/gpufleet"]
    passed = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                        "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED") if k in os.environ}
    for k, v in {**passed, **(extra_env or {})}.items():
        flags += ["--env", f"{k}={v}"]
    return (*sandbox_flags(), *flags)


@contextlib.contextmanager
def running_dockerd():
    """A Docker daemon on a private socket and data root, with the example image built; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-dockerd-", dir="/tmp"))
    d = Dockerd(root)
    try:
        d.start()
        build_example_image(d, root)
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def dockerd():
    """The session's Docker daemon (DOCKER_HOST=dockerd.host for whoever runs docker)."""
    if not shutil.which("dockerd") or os.geteuid() != 0:  # a missing tool fails, never skips (`make tools`)
        pytest.fail("needs dockerd (Debian's docker.io, `make tools`) and root")
    with running_dockerd() as d:
        yield d
