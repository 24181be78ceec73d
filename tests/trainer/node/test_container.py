"""The container launcher (trainer.node.container): the one way a job, outside the docker group, reaches the daemon.

Pure: what a request may name (no docker option, mount, device or another user's directory) and the argv it
becomes (always the caller's uid, labelled with it). On a real Docker daemon: the launcher run as sudo runs it
(root, SUDO_UID/SUDO_GID of the caller) starts the container as the caller and stops only the caller's; and with a
real sudo and a user outside the docker group, that user reaches docker only through the launcher (issue 23).
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.trainer.dockerd import BASE_IMAGE, dockerd  # noqa: F401 (fixture)
from trainer.errors import UsageError
from trainer.node import container
from trainer.node.runner import NOBODY, NodeFacts

ME = (os.getuid(), os.getgid())


def request(tmp_path, **changes) -> dict:
    scratch = tmp_path / "scratch"
    control = tmp_path / "control"
    scratch.mkdir(exist_ok=True)
    control.mkdir(exist_ok=True)
    req = container.make_request("job-1", "registry.example:5000/team/img:1", ["python", "-c", "print(1)"],
                                 {"A": "1", "DB_PASS": "hunter2"}, ("DB_PASS",), None, 0, 30, str(control),
                                 str(scratch))
    return {**req, **changes}


# --- what a request may name ---------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, why", [
    ({"image": "--privileged"}, "bad image reference '--privileged'"),
    ({"image": "img:1 --privileged"}, "bad image reference"),
    ({"image": "img:1\n"}, "bad image reference"),
    ({"name": "-x"}, "bad container name '-x'"),
    ({"env": {"A=B": "1"}}, "bad env names ['A=B']"),
    ({"env": {"A": 1}}, "env values are not strings"),
    ({"secret_names": ["NOPE"]}, "secret names not in env"),
    ({"command": "sh -c id"}, "the command is not a list of strings"),
    ({"privileged": True}, "unknown request keys ['privileged']"),
    ({"scratch_dir": "scratch"}, "is not an absolute, normalised path"),
    ({"scratch_dir": "/tmp/../etc"}, "is not an absolute, normalised path"),
    ({"scratch_dir": "/etc:/mnt/scratch"}, "is not an absolute, normalised path"),
    ({"grace_s": -1}, "grace_s is not a count"),
    ({"login": {"host": "h"}}, "bad registry login"),
])
def test_a_request_names_no_docker_option_and_a_bad_one_is_one_line(tmp_path, changes, why):
    with pytest.raises(UsageError) as err:
        container.check_request(request(tmp_path, **changes), ME)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_extra_docker_flags_are_roots_only(tmp_path):
    req = request(tmp_path, extra=["--privileged"])
    assert container.check_request(req, (0, 0))["extra"] == ("--privileged",)  # the tests' host mounts, as root
    with pytest.raises(UsageError, match="extra docker flags are root's only"):
        container.check_request(req, (4321, 4321))


def test_a_directory_must_be_the_callers_own_and_no_link(tmp_path):
    req = request(tmp_path)
    with pytest.raises(UsageError, match=r"is not the caller's \(owner uid"):
        container.check_request(req, (4321, 4321))  # the test's (root's) directories
    os.chown(req["scratch_dir"], 4321, 4321)
    os.chown(req["control_dir"], 4321, 4321)
    assert container.check_request(req, (4321, 4321))["scratch_dir"] == req["scratch_dir"]
    link = tmp_path / "link"
    link.symlink_to(req["scratch_dir"])
    with pytest.raises(UsageError, match="is not a directory \\(a link is not followed\\)"):
        container.check_request({**req, "scratch_dir": str(link)}, (4321, 4321))
    with pytest.raises(UsageError, match="No such file"):
        container.check_request({**req, "control_dir": str(tmp_path / "gone")}, (4321, 4321))


def test_the_argv_runs_as_the_caller_labelled_with_its_uid_and_its_values_stay_out(tmp_path):
    req = container.check_request(request(tmp_path), (0, 0))
    argv = container.run_argv(req, (4321, 4322), NodeFacts("aws", 0), env_file=False)
    assert argv[:4] == ["docker", "run", "--label", "gpufleet.uid=4321"]
    assert argv[argv.index("--user") + 1] == "4321:4322"
    assert argv[argv.index("--name") + 1] == "gpufleet-4321-job-1"
    assert "--env" in argv and "DB_PASS" in argv and "hunter2" not in " ".join(argv)  # by name only
    assert argv[-4:] == ["registry.example:5000/team/img:1", "python", "-c", "print(1)"]
    as_root = container.run_argv(req, (0, 0), NodeFacts("aws", 0), env_file=False)
    assert as_root[as_root.index("--user") + 1] == "{}:{}".format(*NOBODY)  # never root


def test_the_caller_is_sudos_only_for_root(monkeypatch):
    monkeypatch.setenv("SUDO_UID", "4321")
    monkeypatch.setenv("SUDO_GID", "4322")
    assert container.caller() == ((4321, 4322) if os.getuid() == 0 else ME)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1000)
    assert container.caller() == (1000, 1000)  # a user's own SUDO_UID is no one's word
    assert container.launcher_argv() == ["sudo", "-n", container.LAUNCHER]


def test_a_bad_request_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "trainer", "container", "run"], input="[1]", capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr == "error: container: the request is not a JSON object\n"
    done = subprocess.run([sys.executable, "-m", "trainer", "container", "run"], input=b'{"name": "\xff"}',
                          capture_output=True)
    assert done.returncode == 2 and done.stderr.decode().startswith("error: container: the request is not JSON (")
    assert done.stderr.count(b"\n") == 1
    done = subprocess.run([sys.executable, "-m", "trainer", "container", "job", "--privileged"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: the following arguments are required: image")


# --- on a real Docker daemon ---------------------------------------------------------------------------------

UID_SCRIPT = ("while read k v rest; do if [ \"$k\" = Uid: ]; then echo \"$v $rest\"; fi; done "
              "</proc/self/status >/mnt/scratch/uid")


def launcher(dockerd, req: dict | None, *args, uid: int | None = None) -> subprocess.CompletedProcess:
    """The launcher as sudo runs it for ``uid`` (root, SUDO_UID/SUDO_GID set; sudo's environment has no more)."""
    env = {"PATH": os.environ["PATH"], "DOCKER_HOST": dockerd.host}
    if uid is not None:
        env.update(SUDO_UID=str(uid), SUDO_GID=str(uid))
    for key in ("PYTHONPATH", "GPUFLEET_LOOPBACK_LOG"):  # the loopback guard
        if key in os.environ:
            env[key] = os.environ[key]
    return subprocess.run([sys.executable, "-m", "trainer", "container", *args], env=env, capture_output=True,
                          text=True, input=None if req is None else json.dumps(req), timeout=120)


@pytest.mark.slow
def test_the_launcher_runs_the_callers_container_as_the_caller_and_stops_only_the_callers(dockerd, tmp_path):
    req = request(tmp_path, image=BASE_IMAGE, command=["/bin/sh", "-c", UID_SCRIPT], secret_names=[],
                  env={"A": "1"})
    for key in ("scratch_dir", "control_dir"):
        os.chown(req[key], 4321, 4321)
    done = launcher(dockerd, req, "run", uid=4321)
    assert done.returncode == 0, done.stderr
    assert (Path(req["scratch_dir"]) / "uid").read_text().split() == ["4321"] * 4  # real, effective, saved, fs
    assert "for uid 4321" in done.stderr

    sleeper = {**req, "name": "sleeper", "command": ["/bin/sh", "-c", "while :; do :; done"]}  # dash alone
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "container", "run"], stdin=subprocess.PIPE,
                            env={"PATH": os.environ["PATH"], "DOCKER_HOST": dockerd.host, "SUDO_UID": "4321",
                                 "SUDO_GID": "4321", **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}})
    proc.stdin.write(json.dumps(sleeper).encode())
    proc.stdin.close()
    try:
        name = container.container_name(4321, "sleeper")
        for _ in range(300):
            if dockerd.docker("inspect", name, check=False).returncode == 0:
                break
            subprocess.run(["sleep", "0.1"])
        other = launcher(dockerd, None, "stop", name, "--time", "1", uid=999)
        assert other.returncode == 2 and f"{name} is not a container of uid 999" in other.stderr
        assert dockerd.docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"
        mine = launcher(dockerd, None, "stop", name, "--time", "1", uid=4321)
        assert mine.returncode == 0, mine.stderr
        assert proc.wait(60) != 0
    finally:
        proc.kill()
        dockerd.docker("rm", "-f", container.container_name(4321, "sleeper"), check=False)


# --- with a real sudo and a user outside the docker group ------------------------------------------------------

USER = "gpufleet-test-job"


@pytest.fixture
def job_user():
    """A user of the test's, in no group but its own, and a sudoers rule that lets it run a launcher of the test's
    (root's, this daemon's DOCKER_HOST fixed in it) and nothing else; both removed after."""
    if not shutil.which("sudo") or not shutil.which("visudo"):  # `make tools` installs sudo
        pytest.fail("needs sudo (Debian's sudo, `make tools`)")
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/sh", USER],
                          capture_output=True, text=True)
    assert made.returncode in (0, 9), made.stderr  # 9: it is there already
    yield pwd.getpwnam(USER)
    subprocess.run(["userdel", USER], capture_output=True)


@pytest.mark.slow
def test_a_user_outside_the_docker_group_reaches_docker_only_through_the_launcher(dockerd, job_user, tmp_path):
    """Issue 23: a job's user is not root's equivalent. Docker's socket refuses it; sudo runs the launcher for it and
    nothing else; the launcher starts its container as that user, never with a flag of its choosing."""
    where = Path(tempfile.mkdtemp(prefix="gpufleet-launcher-", dir="/tmp"))
    where.chmod(0o755)
    wrapper = where / "gpufleet-container"
    guard = {k: os.environ[k] for k in ("PYTHONPATH", "GPUFLEET_LOOPBACK_LOG") if k in os.environ}
    wrapper.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in guard.items()) +
                       f"export DOCKER_HOST='{dockerd.host}'\nexec {sys.executable} -m trainer container \"$@\"\n")
    wrapper.chmod(0o755)
    rule = Path(f"/etc/sudoers.d/gpufleet-test-{os.getpid()}")
    rule.write_text(f"{USER} ALL=(root) NOPASSWD: {wrapper}\n")
    rule.chmod(0o440)
    try:
        assert subprocess.run(["visudo", "-cf", str(rule)], capture_output=True).returncode == 0
        as_user = ["runuser", "-u", USER, "--"]
        direct = subprocess.run([*as_user, "docker", "-H", dockerd.host, "ps"], capture_output=True, text=True)
        assert direct.returncode != 0 and "permission denied" in direct.stderr.lower()
        shell = subprocess.run([*as_user, "sudo", "-n", "/bin/sh", "-c", "id"], capture_output=True, text=True)
        assert shell.returncode != 0  # sudo runs the launcher for it, nothing else

        scratch = tmp_path / "scratch"
        scratch.mkdir()
        os.chown(scratch, job_user.pw_uid, job_user.pw_gid)
        tmp_path.chmod(0o755)
        req = container.make_request("mine", BASE_IMAGE, ["/bin/sh", "-c", UID_SCRIPT], {}, (), None, 0, 5, None,
                                     str(scratch))
        done = subprocess.run([*as_user, "sudo", "-n", str(wrapper), "run"], input=json.dumps(req),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (scratch / "uid").read_text().split() == [str(job_user.pw_uid)] * 4
        hostile = {**req, "extra": ["--privileged", "--volume", "/:/host"]}
        refused = subprocess.run([*as_user, "sudo", "-n", str(wrapper), "run"], input=json.dumps(hostile),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and refused.stderr.strip() == \
            "error: container: extra docker flags are root's only"
        root_dir = {**req, "scratch_dir": str(where)}  # root's: not the caller's to mount
        refused = subprocess.run([*as_user, "sudo", "-n", str(wrapper), "run"], input=json.dumps(root_dir),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "is not the caller's" in refused.stderr
    finally:
        rule.unlink()
        shutil.rmtree(where, ignore_errors=True)
