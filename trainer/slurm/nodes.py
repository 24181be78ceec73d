"""`python -m trainer nodes resume|suspend|resume-fail|watch|health|heal`: Slurm's power saving, a node's notice
watcher and its health check, and the controller's healer of DOWN nodes.

slurmctld runs ``resume HOSTLIST`` (ResumeProgram) when jobs need powered-down nodes, ``suspend HOSTLIST``
(SuspendProgram) when nodes have been idle for SuspendTime, and ``resume-fail HOSTLIST`` (ResumeFailProgram) for
nodes that did not register within ResumeTimeout. Each calls the node provider (:class:`NodeProvider`, the
interface the clouds implement) named in the nodes config (``--config``, default /etc/gpufleet/nodes.json).
This module implements the local provider: a node is a ``slurmd -N NAME`` process on this host (the box).

``watch NAME`` runs beside slurmd on a node: on a stop notice (a spot interruption from the node's metadata
service) it drains the node, requeues its jobs (they get SIGTERM, checkpoint, exit and run again elsewhere from
their checkpoint, a multi-node job whole) and powers the node down once they are gone (``POWER_DOWN_ASAP``).

The watcher also runs ``health NAME`` when the node starts and every HEALTH_EVERY_S (it can be run by hand too):
the node's preflight (GPUs, EFA and its NCCL plugin, the fabric manager) against its Slurm definition; a node
that fails is drained and its jobs requeued.

``heal`` runs on the controller as Slurm's administrator (the slurm user: gpufleet-heal.service; the box starts it
beside slurmctld): every few seconds it powers down the CLOUD nodes Slurm holds DOWN (:func:`heal`), and once a
minute it publishes the node gauges the stack's alarms read (:func:`node_gauges`) as EMF records. It keeps no
state: how long a node has been held is read from Slurm's own stamp of its reason.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.clouds import adapter, node_adapter
from trainer.errors import ArgumentParser, UsageError
from trainer.loop.stop import StopNotice
from trainer.node import metric_names
from trainer.node.preflight import HostProbe, check
from trainer.periodic import Periodic
from trainer.slurm import client
from trainer.slurm.bridge import add_gauge_flags, gauge_emitter, metric_namespace
from trainer.slurm.client import SlurmError, SlurmNode

log = logging.getLogger("gpufleet.nodes")

CONFIG = "/etc/gpufleet/nodes.json"
STOP_WAIT_S = 10.0
HEALTH_EVERY_S = 300.0
HEAL_EVERY_S = 5.0
GAUGES_EVERY_S = 60.0
# A node whose machine could not be started (no capacity, a quota, a spot price: the node provider set it DOWN with
# "resume failed: ...") or that did not register within ResumeTimeout stays DOWN this long, counted from the time
# Slurm stamped on its reason, before it is powered down for the next job to try again (ParallelCluster's
# insufficient_capacity_timeout, default 600 s, is the model). Slurm requeued its job at once; meanwhile the
# scheduler places it on other nodes.
RESUME_FAIL_HOLD_S = 600.0
RESUME_FAILED = ("resume failed:", "ResumeTimeout reached")  # the providers' reason; Slurm's own (22.05 and 26.05)


class NodeProvider:
    """What power saving asks of a cloud: start and stop the machines behind Slurm node names."""

    def resume(self, names: list[str]) -> None:
        raise NotImplementedError

    def suspend(self, names: list[str]) -> None:
        raise NotImplementedError

    def resume_failed(self, names: list[str]) -> None:
        """Nodes that did not register in time: whatever was started for them is stopped."""
        self.suspend(names)


def _clear_signal_mask() -> None:
    """slurmctld runs its programs with signals blocked; a daemon started from one must not inherit that."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pid(pid: int | None, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM, then SIGKILL after ``wait_s``."""
    if pid is None or not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def after_the_resume_second(clock=time.time, sleep=time.sleep) -> None:
    """Return once the wall clock is past the whole second it reads now: the box starts a node's ``slurmd -b`` only
    then.

    slurmctld stamps a resume request with its whole second (boot_req_time) and ignores a node's registration while
    the boot time it derives from it is earlier (Slurm 22.05, waiting_for_node_boot in src/slurmctld/node_mgr.c): its
    own whole second minus the uptime slurmd reports. With -b that uptime is the difference of two readings of the
    host's uptime, whole seconds that do not tick with the wall clock's: read just before a tick and registered just
    after it, still in the request's second, slurmd reports 1 s and seems to have booted before the request.
    slurmctld drops that only registration and pings no node that is powering up, so it never learns the node's
    address (cloud_reg_addrs set it back to the node's name, which does not resolve): the job waits out ResumeTimeout
    and is requeued. A slurmd that first reads the uptime in a later second than the request's cannot seem to have
    booted before it."""
    start = int(clock()) + 1
    while (now := clock()) < start:
        sleep(start - now)


class LocalProvider(NodeProvider):
    """Nodes as slurmd processes on this host (several ``slurmd -N``), each with its notice watcher.

    config: {"provider": "local", "slurm_conf", "run_dir" (slurmd's pid files: SlurmdPidFile's directory),
    "spool_dir", "python", "nodes": {name: {"imds": the node's metadata endpoint, "notice_file"}}, and optionally
    "stand_ins": a directory first on the watchers' PATH, whose tools stand in for the hardware's (the box's
    nvidia-smi, which reports its nodes' one stand-in GPU to the health check)}.
    """

    def __init__(self, config: dict, config_path: str):
        self.config, self.config_path = config, config_path
        self.run_dir = Path(config["run_dir"])

    def _daemon(self, argv: list[str], env: dict[str, str] | None = None, log_path: Path | None = None) -> int:
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                    start_new_session=True, close_fds=True, preexec_fn=_clear_signal_mask)
        finally:
            if log_path:
                out.close()
        return proc.pid

    def resume(self, names: list[str]) -> None:
        for name in names:
            if name not in self.config["nodes"]:
                raise UsageError(f"nodes: {name} is not a node of this box")
        after_the_resume_second()
        for name in names:
            node = self.config["nodes"][name]
            Path(self.config["spool_dir"], name).mkdir(parents=True, exist_ok=True)
            Path(node["notice_file"]).unlink(missing_ok=True)  # a fresh machine: no notice
            # -b: report a boot now, as a machine that just started would (all slurmd here share the host's boot)
            self._daemon([client.exe("slurmd"), "-b", "-f", self.config["slurm_conf"], "-N", name])
            env = {**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": node["imds"], "SLURM_CONF":
                   self.config["slurm_conf"]}
            env.pop("AWS_EC2_METADATA_DISABLED", None)
            if self.config.get("stand_ins"):
                env["PATH"] = os.pathsep.join([self.config["stand_ins"], env.get("PATH", os.defpath)])
            pid = self._daemon([self.config["python"], "-m", "trainer", "nodes", "watch", name, "--config",
                                self.config_path], env=env, log_path=Path(self.config["log_dir"], f"watch-{name}.log"))
            (self.run_dir / f"watch-{name}.pid").write_text(f"{pid}\n")
            log.info("node %s: slurmd and its notice watcher started", name)

    def suspend(self, names: list[str]) -> None:
        for name in names:
            stop_pid(_pid(self.run_dir / f"watch-{name}.pid"), 2.0)
            stop_pid(_pid(self.run_dir / f"slurmd-{name}.pid"))
            for pidfile in (self.run_dir / f"watch-{name}.pid", self.run_dir / f"slurmd-{name}.pid"):
                pidfile.unlink(missing_ok=True)
            log.info("node %s: stopped", name)


PROVIDERS = {"local": LocalProvider}


def load_config(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"nodes: --config {path}: no such file (the controller's user-data, or the box, writes "
                         "it)") from None
    except ValueError as exc:
        raise UsageError(f"nodes: --config {path}: not JSON ({exc})") from None


def provider(config: dict, path: str) -> NodeProvider:
    name = config.get("provider")
    if name in PROVIDERS:
        return PROVIDERS[name](config, path)
    try:
        return node_adapter(name).NodeProvider(config)
    except (KeyError, AttributeError, ImportError):
        raise UsageError(f"nodes: provider {name!r} is not known; expected local or a cloud with a node "
                         "provider") from None


def watch(name: str, config: dict, poll_s: float = 2.0) -> int:
    """The node's health check when it starts and every ``health_every_s`` (config, default HEALTH_EVERY_S; 0:
    never), and, until a stop notice comes: then drain this node, requeue its jobs, power it down when they are
    gone."""
    notice = StopNotice()
    watcher = adapter(config.get("cloud", "aws")).start_watcher(notice, {}, interval_s=poll_s)
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    every = float(config.get("health_every_s", HEALTH_EVERY_S))
    checked = None
    while not notice.is_set() and not stop["asked"] and watcher.is_alive():
        if every and (checked is None or time.monotonic() - checked >= every):
            checked = time.monotonic()
            try:
                health(name)
            except Exception as exc:  # slurmctld unreachable for a moment: the next round tries again
                log.warning("node %s: health check not done (%s)", name, exc)
        time.sleep(0.1)
    if not notice.is_set():
        return 0
    on_notice(name, notice.reason or "stop notice")
    return 0


def on_notice(name: str, reason: str) -> list[str]:
    """A node going away: no new job lands on it, its jobs are requeued (Slurm sends them SIGTERM, they
    checkpoint, exit, and run again elsewhere), and it powers down once they are gone. The requeued job ids."""
    why = f"notice: {reason}"[:200]
    client.update_node(name, state="DRAIN", reason=why)
    jobs = client.jobs_on(name)
    for job in jobs:
        client.requeue(job)
    log.warning("node %s: %s; drained, requeued %s", name, reason, ", ".join(jobs) or "no job")
    client.update_node(name, state="POWER_DOWN_ASAP", reason=why)
    return jobs


def expected_hardware(fields: dict[str, str]) -> dict:
    """What a node must have, from its Slurm definition (the catalog's, through slurm.conf): its GPUs
    (Gres=gpu:N) and, by feature, EFA and NVSwitch (the fabric manager). The preflight's row."""
    gres = fields.get("Gres") or ""
    gpus = next((int(g.split("(")[0].split(":")[-1]) for g in gres.split(",") if g.startswith("gpu:")), 0)
    features = set((fields.get("AvailableFeatures") or "").split(","))
    return {"gpus": gpus, "efa": 1 if "efa" in features else 0, "nvswitch": "nvswitch" in features}


def health(name: str, probe=None) -> int:
    """The node's health check (its watcher runs it when the node starts and every few minutes; Slurm's own
    HealthCheckProgram hung powering-up nodes here, see trainer.slurm.conf): the preflight of this node against
    its Slurm definition. A node that fails is drained, with the failed checks as the reason, and its jobs
    requeued to run elsewhere; it stays drained until an operator resumes it (`scontrol update nodename=NAME
    state=resume`). Exit 0 either way: the drain is the verdict."""
    findings = check(expected_hardware(client.node_fields(name)), probe or HostProbe())
    failed = [f for f in findings if not f.ok]
    if not failed:
        log.info("node %s: health check passed (%s)", name, "; ".join(f"{f.check}: {f.detail}" for f in findings))
        return 0
    why = ("preflight: " + "; ".join(f"{f.check}: {f.detail}" for f in failed))[:200]
    client.update_node(name, state="DRAIN", reason=why)
    jobs = client.jobs_on(name)
    for job in jobs:
        client.requeue(job)
    log.error("node %s: %s; drained, requeued %s", name, why, ", ".join(jobs) or "no job")
    return 0


# --- heal: the controller's daemon, as Slurm's administrator -----------------------------------------------------

def resume_failure(reason: str) -> str | None:
    """The part of a node's reason that says its resume failed, or None. A provider sets the whole reason
    (`scontrol update` replaces it); Slurm's own "ResumeTimeout reached" replaces no reason in 22.05 but one other
    than "Not responding", and is appended to whatever was there (" : ResumeTimeout reached") from 23.11 on
    (set_node_reason in src/slurmctld/node_mgr.c): the newest part is the last."""
    for part in (reason, reason.rsplit(" : ", 1)[-1]):
        if part.startswith(RESUME_FAILED):
            return part
    return None


def failed_to_resume(node: SlurmNode) -> bool:
    """DOWN because its machine could not be started or did not register in time."""
    return node.state.startswith("down") and resume_failure(node.reason) is not None


def node_gauges(nodes: list[SlurmNode]) -> dict[str, float]:
    """The controller's node gauges: nodes powered up (neither powered down, ~, nor powering down, %; a node whose
    resume failed holds no machine, whatever Slurm still says) and nodes that failed to resume."""
    failed = [n for n in nodes if failed_to_resume(n)]
    up = [n for n in nodes if "~" not in n.state and "%" not in n.state and not failed_to_resume(n)]
    return {metric_names.NODES_UP: float(len(up)), metric_names.NODES_FAILED_TO_RESUME: float(len(failed))}


def heal(nodes: list[SlurmNode], now: float, slurm=client, first_seen: dict[str, float] | None = None) -> list[str]:
    """CLOUD nodes Slurm marked DOWN because they stopped answering (a machine gone without notice): powered down,
    so that power saving cleans up what is left of them and starts a fresh one when a job needs it. Slurm requeued
    their jobs already. A node DOWN because its machine could not be started or did not register
    (:func:`resume_failure`; "down#" while Slurm still waits for it, "down~" after ResumeTimeout) is first held for
    RESUME_FAIL_HOLD_S from the time Slurm stamped on its reason (sinfo's %H), so that the next job does not retry
    the same capacity at once; nothing else is remembered across rounds or restarts (``first_seen``: when a reason
    without a stamp was first seen). POWER_DOWN_FORCE runs the suspend program (whatever was started is terminated)
    and leaves the node idle and powered down (Slurm 22.05, measured for both). The nodes it powered down."""
    seen = first_seen if first_seen is not None else {}
    unstamped: dict[str, float] = {}
    powered = []
    for node in nodes:
        name, state, why = node.name, node.state, resume_failure(node.reason)
        if not state.startswith("down") or "%" in state:
            continue
        if why is not None:
            since = node.reason_time
            if since is None:
                since = unstamped[name] = seen.get(name, now)
            if now - since < RESUME_FAIL_HOLD_S:
                continue
            unstamped.pop(name, None)
            log.warning("node %s: %s; held %.0f s, powering it down for the next job to try again", name, why,
                        now - since)
            slurm.update_node(name, state="POWER_DOWN_FORCE", reason=f"held after: {why}"[:200])
        elif "~" in state:
            continue  # powered down by someone else's reason: left as it is
        else:
            log.warning("node %s: down and not responding; powering it down", name)
            slurm.update_node(name, state="POWER_DOWN_FORCE", reason="not responding")
        powered.append(name)
    seen.clear()
    seen.update(unstamped)
    return powered


def serve_heal(stop: threading.Event, every_s: float = HEAL_EVERY_S, emitter=None, slurm=client,
               clock=time.time) -> int:
    """Heal every ``every_s`` and publish the node gauges every GAUGES_EVERY_S until ``stop`` is set. Slurm
    away for a moment (slurmctld restarting) is a warning; the next round tries again."""
    log.info("heal: DOWN CLOUD nodes powered down every %.0f s (%.0f s hold after a failed resume)", every_s,
             RESUME_FAIL_HOLD_S)
    first_seen: dict[str, float] = {}
    last_gauges: float | None = None

    def heal_round() -> None:
        nonlocal last_gauges
        try:
            nodes = slurm.nodes()
            now = clock()
            if emitter is not None and (last_gauges is None or now - last_gauges >= GAUGES_EVERY_S):
                emitter.emit(node_gauges(nodes))
                last_gauges = now
            heal(nodes, now, slurm, first_seen)
        except SlurmError as exc:
            log.warning("Slurm: %s; trying again", exc)

    Periodic(heal_round, every_s, "heal", at_once=True, stopped=stop).run()  # in this thread: a signal sets stop
    return 0


def _heal_main(args) -> int:
    if not args.every > 0:
        raise UsageError(f"nodes heal: --every {args.every:g} is not allowed; expected seconds > 0")
    emitter = gauge_emitter(args.emf_log, metric_namespace(args.metric_namespace), "nodes heal")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return serve_heal(stop, args.every, emitter)


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer nodes", description="Slurm's power saving programs, a node's "
                       "notice watcher and health check, and the controller's healer of DOWN nodes.")
    p.add_argument("action", choices=("resume", "suspend", "resume-fail", "watch", "health", "heal"))
    p.add_argument("hostlist", nargs="?", help="Slurm's hostlist expression of the nodes (watch, health: this "
                   "node's name; heal: none)")
    p.add_argument("--config", default=os.environ.get("GPUFLEET_NODES_CONFIG", CONFIG),
                   help="the nodes config (provider and its settings; heal reads none)")
    p.add_argument("--every", type=float, default=HEAL_EVERY_S, help="heal: seconds between two rounds")
    add_gauge_flags(p)
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.action == "heal":
        if args.hostlist:
            raise UsageError(f"nodes heal: takes no hostlist (got {args.hostlist!r}); it looks at every node")
        return _heal_main(args)
    if not args.hostlist:
        raise UsageError(f"nodes {args.action}: a hostlist is required (watch, health: this node's name)")
    config = load_config(args.config)
    if config.get("slurm_conf"):
        os.environ.setdefault("SLURM_CONF", config["slurm_conf"])
    if args.action == "watch":
        return watch(args.hostlist, config)
    if args.action == "health":
        return health(args.hostlist)
    names = client.hostnames(args.hostlist)
    nodes = provider(config, args.config)
    {"resume": nodes.resume, "suspend": nodes.suspend, "resume-fail": nodes.resume_failed}[args.action](names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
