"""The box's one long-lived process (``python -m infra.box serve``, started in the background by `box up`).

It holds the account (moto server with the dev stack's bucket and queues, from its preview, as the demo made
them), a fake metadata endpoint per node, the box's own munged, slurmctld, the bridge and the healer of DOWN nodes
(`python -m trainer nodes heal`; each of the last three started again when it dies, as systemd's Restart=always
does on a controller). Nodes are Slurm CLOUD nodes: slurmctld's power saving starts and stops them
(trainer.slurm.nodes, the local provider). A node's notice file (`box notice NODE`) turns into a spot interruption
notice at its metadata endpoint. The bridge and the healer publish the controller's gauges to the box's EMF file.

Slurm's accounting is the box's own MariaDB and slurmdbd: each team of the stack's config (gpufleet:teams) an
account with its fair share and GPU limit, which Slurm enforces. A box run by root runs each team's jobs as the
team's Unix user, as a cluster does (trainer.slurm.users: it makes them on this machine, gpufleet-<team>); a box
of another user runs them all as that user.

SIGTERM stops it all: the bridge and the healer, the nodes (their slurmd, watchers and jobs), slurmctld, slurmdbd,
MariaDB, munged, moto, and anything left below this process; then state.json is removed.
"""
from __future__ import annotations

import functools
import grp
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from infra import config
from infra.box import layout as lay
from infra.demo.account import CREDENTIALS, REPO, Account, become_subreaper, descendants, preview_document
from infra.demo.imds import FakeImds
from infra.preview.__main__ import stack_file
from trainer.node import metric_names
from trainer.node.container import LAUNCHER_VARIABLE
from trainer.slurm import accounts, setup, users
from trainer.slurm.conf import render_gres_conf, render_slurm_conf
from trainer.slurm.nodes import LocalProvider

log = logging.getLogger("gpufleet.box")

READY_TIMEOUT_S = 30.0
ACCOUNT_ID = "123456789012"  # moto's
BOX_ID = "GPUFLEET_BOX_ID"  # in the environment of every process of a box (how `down` finds them all)


class Supervisor:
    def __init__(self, layout: lay.Layout, stack: str = "dev"):
        self.layout, self.stack = layout, stack
        self.account = Account(stack, layout.root / "account", keep_dir=True)
        self.imds: dict[str, FakeImds] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.python = sys.executable
        self.box_id = secrets.token_hex(8)

    # --- start -----------------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What the bridge, and through sbatch every job, runs with: the account, Slurm's config, the work dir."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_"))}
        env.update(CREDENTIALS, AWS_ENDPOINT_URL=self.account.endpoint, AWS_DEFAULT_REGION=self.account.res.region,
                   AWS_EC2_METADATA_DISABLED="true", SLURM_CONF=str(self.layout.slurm_conf),
                   GPUFLEET_WORK_DIR=str(self.layout.work_dir),
                   GPUFLEET_EMF_LOG=str(self.layout.log_dir / "metrics.log"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   OMP_NUM_THREADS="1", TMPDIR=str(self.layout.root / "tmp"), **{BOX_ID: self.box_id})
        if lay.team_users():  # the jobs' tasks reach Docker through the box's launcher
            env[LAUNCHER_VARIABLE] = str(self.layout.launcher)
        return env

    def start(self) -> dict:
        L = self.layout
        if lay.team_users():  # a box its teams' users cannot reach stops before anything is made or started
            for above in L.root.parents:
                if not os.stat(above).st_mode & stat.S_IXOTH:
                    raise RuntimeError(f"the teams' users cannot reach {L.root}: {above} is not searchable by "
                                       "others (give --dir below a directory they can reach, such as /tmp)")
        for d in (L.root / "account", L.root / "tmp", L.slurm / "bin", L.slurm / "state",
                  L.log_dir, L.run_dir, L.output_dir, L.work_dir, L.munge_key.parent,
                  *(L.notice_file(n).parent for n in L.node_names())):
            d.mkdir(parents=True, exist_ok=True)
        L.sockets.mkdir(mode=0o755, exist_ok=True)
        L.spool_dir.mkdir(exist_ok=True)
        self.open_to_teams()
        self.account.start(preview_document(self.stack))
        self.account.provision()
        r = self.account.res
        for i, name in enumerate(L.node_names()):
            self.imds[name] = FakeImds(f"i-0b0x{i:013x}", L.instance_type, f"10.0.0.{10 + i}", r.region).__enter__()
        self.start_munge()
        self.write_slurm(L)
        self.start_accounting()
        self.start_controller()
        self.wait_controller()
        self.apply_teams()
        for _, start in self.credentials_starters():
            start()
        self.start_bridge()
        self.start_heal()
        state = {"pid": os.getpid(), "dir": str(L.root), "stack": self.stack, "endpoint": self.account.endpoint,
                 "region": r.region, "bucket": r.bucket_name, "queue_url": self.account.queue_url,
                 "dlq_url": self.account.dlq_url, "team_queues": self.account.team_queues,
                 "team_dead_letters": self.account.team_dead_letters,
                 "slurm_conf": str(L.slurm_conf),
                 "instance_type": L.instance_type, "nodes": {n: self.imds[n].endpoint for n in L.node_names()},
                 "slurmctld_port": L.ports()["slurmctld"], "box_id": self.box_id, "started": time.time()}
        tmp = L.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(L.state_file)
        return state

    def open_to_teams(self) -> None:
        """Each team's work and output directory; where the box runs jobs as the teams' users (root: see
        trainer.slurm.users), those users made and their directories theirs (0700), and what their jobs must reach
        searchable or writable: the box's directory (0711, every directory above it searchable), slurm.conf, the
        box's TMPDIR (1777) and its EMF file (appended by the teams' group, 0620), each user's home (as on a node,
        /var/lib/gpufleet/teams/<team>, 0700), never the munge key, the accounting, the bridge's env values or
        Slurm's state (0700); the directories above the checkout and its environment searchable (a clone in a 0700
        temporary directory is not); and the box's launcher of jobs' containers, which the teams' users may run
        through sudo (:meth:`install_launcher`)."""
        L = self.layout
        names = [t.name for t in self.teams]
        if not lay.team_users():
            for team in names:
                L.team_work_dir(team).mkdir(parents=True, exist_ok=True)
                L.team_output_dir(team).mkdir(parents=True, exist_ok=True)
            return
        users.ensure(names, _command)
        os.chmod(L.root, 0o711)
        os.chmod(L.root / "tmp", 0o1777)
        for private in (L.slurm / "state", L.munge_key.parent, L.root / "account"):
            os.chmod(private, 0o700)
        metrics = L.log_dir / "metrics.log"
        metrics.touch()
        os.chown(metrics, 0, grp.getgrnam(users.GROUP).gr_gid)
        os.chmod(metrics, 0o620)
        for team in names:
            uid = users.uid_of(team)
            for d in (L.team_work_dir(team), L.team_output_dir(team)):
                d.mkdir(parents=True, exist_ok=True)
                os.chown(d, uid, uid)
                os.chmod(d, 0o700)
            # the team user's home, made as a node's setup makes it (a job's HOME: its caches and configs); like
            # the users, it outlives the box
            setup.make_private_dir(setup.System(), users.home_of(team), (uid, uid))
        self.install_launcher()
        for top in (REPO, Path(sys.prefix)):  # the checkout and its environment, which the teams' jobs run
            for above in (top, *top.parents):
                mode = os.stat(above).st_mode
                if not mode & stat.S_IXOTH:  # searchable only: nothing listed, read or written
                    os.chmod(above, stat.S_IMODE(mode) | stat.S_IXOTH)
                    log.warning("%s made searchable by others: the teams' users run the trainer below it", above)
        team = users.name_of(names[0])
        probe = subprocess.run(["runuser", "-u", team, "--", self.python, "-c", "import trainer"], cwd="/",
                               env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
                               capture_output=True, text=True)
        if probe.returncode != 0:
            why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
            raise RuntimeError(f"the teams' users cannot run {self.python} with the trainer: {why} (a Python below "
                               "a private home directory cannot run as them: make the venv from /usr/bin/python3)")

    def install_launcher(self) -> None:
        """The box's launcher of jobs' containers (root's, in /run) and the sudoers rule that lets the teams' users
        run it (checked by visudo before sudo reads it); both removed when the box stops."""
        L = self.layout
        L.launcher.parent.mkdir(mode=0o755, exist_ok=True)
        tmp = L.launcher.with_suffix(".tmp")
        tmp.write_text(lay.launcher_script(self.python, os.environ.get("DOCKER_HOST")))
        tmp.chmod(0o755)
        tmp.replace(L.launcher)
        rule = L.sudoers_rule.with_suffix(".tmp")  # sudo reads no file whose name holds a dot
        rule.write_text(lay.launcher_rule(L.launcher))
        rule.chmod(0o440)
        checked = subprocess.run(["visudo", "-cf", str(rule)], capture_output=True, text=True)
        if checked.returncode != 0:
            rule.unlink()
            raise RuntimeError(f"visudo refuses the box's sudoers rule: {checked.stdout.strip()}")
        rule.replace(L.sudoers_rule)

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        with open(self.layout.log_dir / f"{name}.out", "ab") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=env or self.env(), cwd=self.layout.root)

    def start_munge(self) -> None:
        L = self.layout
        if not L.munge_key.exists():
            fd = os.open(L.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(1024))
        m = L.munge_key.parent
        self.procs["munged"] = self._spawn("munged", [
            "munged", "--foreground", f"--socket={L.munge_socket}", f"--key-file={L.munge_key}",
            f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}", f"--log-file={m / 'munged.log'}"])
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not L.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start (see {m / 'munged.log'})")
            time.sleep(0.05)

    def start_accounting(self) -> None:
        """Slurm's accounting: the box's own MariaDB (its files in accounting/db, made once; TCP on loopback and a
        socket for its root) and slurmdbd over it, with a password made at each start; the cluster registered."""
        L = self.layout
        L.accounting.mkdir(exist_ok=True)
        if not (L.database_dir / "mysql").is_dir():
            done = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={L.database_dir}",
                                   f"--user={lay.box_user()}", "--auth-root-authentication-method=socket",
                                   "--skip-test-db"], capture_output=True, text=True, env=self.env())
            if done.returncode != 0:
                raise RuntimeError(f"mariadb-install-db: {(done.stderr or done.stdout).strip()[-300:]}")
        self.start_database()
        password = secrets.token_hex(16)
        dbd = lay.dbd(L, password)
        self._wait_ready("mariadb", ["mariadb", "--no-defaults", f"--socket={L.database_socket}", "-u", "root"],
                         L.log_dir / "mariadb.err", input=accounts.database_grants(dbd))  # no password in argv
        fd = os.open(L.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(accounts.render_slurmdbd_conf(dbd))
        self.start_slurmdbd()
        self._wait_ready("slurmdbd", ["sacctmgr", "-n", "-P", "show", "clusters", "format=cluster"],
                         L.log_dir / "slurmdbd.log")
        accounts.register_cluster(lay.cluster(L).name, env=self.env())

    def start_database(self) -> None:
        L = self.layout
        self.procs["mariadb"] = self._spawn("mariadb", [
            "mariadbd", "--no-defaults", f"--datadir={L.database_dir}", f"--socket={L.database_socket}",
            f"--port={L.ports()['mariadb']}", "--bind-address=127.0.0.1", f"--user={lay.box_user()}",
            f"--pid-file={L.run_dir / 'mariadb.pid'}", f"--log-error={L.log_dir / 'mariadb.err'}",
            "--innodb-buffer-pool-size=32M", "--skip-log-bin"])

    def start_slurmdbd(self) -> None:
        self.procs["slurmdbd"] = self._spawn("slurmdbd", ["slurmdbd", "-D"])

    def _wait_ready(self, name: str, argv: list[str], log_file: Path, input: str | None = None) -> None:
        """Run ``argv`` (``input`` on its standard input) until it succeeds (the daemon ``name`` answers),
        READY_TIMEOUT_S at most."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, input=input)
            if done.returncode == 0:
                return
            proc = self.procs.get(name)
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
                raise RuntimeError(f"{name} did not start: {why[0]} (see {log_file})")
            time.sleep(0.1)

    def apply_teams(self) -> None:
        """Each team of the stack an account with its fair share and GPU limit, with its team's user; the box's
        user (whoever submits with sbatch here, and the bridge where it submits as itself) in each. Slurm knows
        gres/gpu once slurmctld registered: retried."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                accounts.apply(self.teams, [lay.box_user()], env=self.env())
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the teams' accounts: {exc}") from None
                time.sleep(0.2)

    @functools.cached_property
    def teams(self) -> tuple:
        return accounts.teams_of(t.as_json() for t in stack_config(self.stack).teams)

    def write_slurm(self, L: lay.Layout) -> None:
        cluster = lay.cluster(L)
        L.slurm_conf.write_text(render_slurm_conf(cluster))
        (L.slurm / "gres.conf").write_text(render_gres_conf(cluster))
        L.nodes_config.write_text(json.dumps(lay.nodes_config(L, self.python, {
            n: i.endpoint for n, i in self.imds.items()}), indent=2))
        bridge_user = None if lay.team_users() else lay.box_user()
        for program, text in lay.job_program_scripts(L, self.python, self.env(), bridge_user,
                                                         self.account.res.bucket_name).items():
            L.program(program).write_text(text)
            L.program(program).chmod(0o755)
        L.stand_ins.mkdir(exist_ok=True)
        (L.stand_ins / "nvidia-smi").write_text(lay.NVIDIA_SMI)
        (L.stand_ins / "nvidia-smi").chmod(0o755)
        for action, program in (("resume", "resume"), ("suspend", "suspend"), ("resume-fail", "resume_fail")):
            path = L.program(program)
            path.write_text(lay.program_script(self.python, action, L.nodes_config, L.slurm_conf,
                                               L.log_dir / "power.log"))
            path.chmod(0o755)

    def start_controller(self) -> None:
        """slurmctld in the foreground; a restart recovers its jobs from StateSaveLocation."""
        self.procs["slurmctld"] = self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.layout.slurm_conf)])

    def wait_controller(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            done = subprocess.run(["scontrol", "ping"], env=self.env(), capture_output=True, text=True)
            if "UP" in done.stdout:
                return
            if self.procs["slurmctld"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld did not start (see {self.layout.log_dir / 'slurmctld.log'})")
            time.sleep(0.1)

    def start_bridge(self) -> None:
        L, r = self.layout, self.account.res
        # each team's queue, its jobs under the team's account (a stack without team queues: the one queue)
        queues = [f"--team-queue={team}={url}" for team, url in self.account.team_queues.items()] or [
            "--queue-url", self.account.queue_url, "--account", self.teams[0].name]
        self.procs["bridge"] = self._spawn("bridge", [
            self.python, "-m", "trainer", "controller", *queues,
            "--bucket", r.bucket_name, "--output-dir", str(L.output_dir), "--python", self.python,
            "--instance-type", L.instance_type, "--metric-namespace", self.metric_namespace,
            "--env-dir", str(L.bridge_env), "--submit-as", "team" if lay.team_users() else "self"])

    def start_credentials(self, node: str) -> None:
        """A node's job credentials endpoint (on a node: gpufleet-credentials.service, as root), which issues each
        job there the stack's job role through the account's STS."""
        L, r = self.layout, self.account.res
        self.procs[f"credentials {node}"] = self._spawn(f"credentials-{node}", [
            self.python, "-m", "trainer", "credentials", "serve", "--dir", str(L.credentials_dir(node)),
            "--port", str(L.ports()[f"credentials {node}"]), "--bucket", r.bucket_name, "--region", r.region,
            "--role-arn", f"arn:aws:iam::{ACCOUNT_ID}:role/{self.stack}-job"])

    def credentials_starters(self) -> list[tuple[str, Callable[[], None]]]:
        return [(f"credentials {n}", functools.partial(self.start_credentials, n)) for n in self.layout.node_names()]

    def start_heal(self) -> None:
        """The healer of DOWN nodes (as Slurm's administrator: this box's SlurmUser is the user running it)."""
        self.procs["heal"] = self._spawn("heal", [
            self.python, "-m", "trainer", "nodes", "heal", "--metric-namespace", self.metric_namespace])

    @property
    def metric_namespace(self) -> str:
        return metric_names.namespace(self.stack)

    # --- while it runs ---------------------------------------------------------------------------------------

    def tend(self) -> None:
        """Notices asked for become the nodes' metadata; a dead slurmctld, bridge or healer is started again; the
        orphans that came to this subreaper (the daemons' forks: slurmd, slurmstepd) are reaped when they exit."""
        for name, imds in self.imds.items():
            asked = self.layout.notice_file(name).exists()
            has = "meta-data/spot/instance-action" in imds.items
            if asked and not has:
                imds.spot_interruption()
                log.info("node %s: spot interruption notice", name)
            elif has and not asked:
                with imds._lock:
                    imds.items.pop("meta-data/spot/instance-action", None)
        for name, start in (("mariadb", self.start_database), ("slurmdbd", self.start_slurmdbd),
                            ("slurmctld", self.start_controller), ("bridge", self.start_bridge),
                            ("heal", self.start_heal), *self.credentials_starters()):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None and not self.stopping:
                log.warning("%s exited (%s); starting it again", name, proc.returncode)
                start()
        reap_orphans({p.pid for p in self.procs.values()})

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stopping", True))
        while not self.stopping:
            self.tend()
            time.sleep(0.2)
        return 0

    # --- stop ------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stopping = True
        for name in ("bridge", "heal"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.terminate()
                _wait(proc, 10)
        if self.layout.nodes_config.exists():
            try:
                LocalProvider(json.loads(self.layout.nodes_config.read_text()), str(self.layout.nodes_config)) \
                    .suspend(self.layout.node_names())
            except Exception as exc:
                log.warning("stopping the nodes: %s", exc)
        for name in ("slurmctld", *(name for name, _ in self.credentials_starters()), "slurmdbd", "mariadb",
                     "munged"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.terminate()
                _wait(proc, 10)
        kill_box(self.box_id)
        for imds in self.imds.values():
            imds.__exit__(None, None, None)
        self.account.close()
        shutil.rmtree(self.layout.sockets, ignore_errors=True)
        if lay.team_users():
            self.layout.sudoers_rule.unlink(missing_ok=True)
            shutil.rmtree(self.layout.launcher.parent, ignore_errors=True)
        self.layout.state_file.unlink(missing_ok=True)


def stack_config(stack: str):
    """The stack's validated config (Pulumi.<stack>.yaml)."""
    raw, secret_keys = config.read_stack_file(stack_file(stack))
    return config.parse(raw, stack, secret_keys)


def reap_orphans(own: set[int]) -> None:
    """Reap this process's exited children that no Popen of ours waits for."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        pid = int(stat.parent.name)
        if fields[0] == "Z" and fields[1] == me and pid not in own:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _command(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")


def _wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def box_processes(box_id: str) -> list[int]:
    """Processes of this box: below this process, or with its id in their environment (daemons that left us:
    slurmd and its slurmstepd, the watchers, jobs)."""
    mine = set(descendants(os.getpid()))
    marker = f"{BOX_ID}={box_id}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid() or pid in mine:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            mine.add(pid)
    return sorted(mine)


def kill_box(box_id: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of the box until none is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = box_processes(box_id)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)


def main(root: Path, nodes: int, port: int, stack: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    become_subreaper()
    sup = Supervisor(lay.Layout(root, nodes, port), stack)
    try:
        sup.start()
        print("ready", flush=True)
        return sup.serve()
    except Exception as exc:
        log.error("the box could not start: %s", exc)
        (root / "failed").write_text(f"{exc}\n")
        return 1
    finally:
        sup.stop()
