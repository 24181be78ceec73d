"""`gpufleet box up|down|env|status|notice`: the cluster in a box, a real Slurm on this machine.

`up` starts the box in the background (infra.box.supervisor) and prints the `export` lines that point Slurm's
commands and `gpufleet jobs --stack box` at it; `env` prints them again; `status` shows the controller, the nodes
and the jobs; `notice NODE` sends that node a spot interruption notice; `down` stops every process of the box.
A user error (Slurm missing, a port taken, a second box, no box) is one line and exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from infra import cli
from infra.box import layout as lay
from infra.cli import UsageError
from trainer.slurm.nodes import alive as _alive

UP_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 60.0
NEEDS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge",
         "slurmdbd": "slurmdbd", "mariadbd": "mariadb-server"}


def configure(parser: argparse.ArgumentParser) -> None:
    commands = cli.add_commands(parser, "box_command")
    for name, help in (("up", "start the box in the background: moto, munge, slurmctld, the bridge, CLOUD nodes"),
                       ("down", "stop every process of the box"),
                       ("env", "print the export lines for Slurm's commands and `gpufleet jobs --stack box`"),
                       ("status", "the controller, the nodes and the jobs of the box"),
                       ("notice", "send a node a spot interruption notice")):
        p = commands.add_parser(name, help=help, description=help)
        p.add_argument("--dir", type=Path, default=lay.default_dir(), help="the box's directory (GPUFLEET_BOX_DIR)")
        if name == "up":
            p.add_argument("--nodes", type=_count, default=lay.DEFAULT_NODES, help="CLOUD nodes of the box (1-16)")
            p.add_argument("--port", type=_port, default=0,
                           help="slurmctld's port; slurmd's, each node's, each node's job credentials "
                                "endpoint's, slurmdbd's and MariaDB's follow it (0: free ports)")
            p.add_argument("--stack", default="dev", help="the stack whose bucket, queues and teams the box gets")
        if name == "notice":
            p.add_argument("node", help="the node's name (`gpufleet box status` lists them)")


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected an integer from 1 to 16")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or not (int(text) == 0 or 1024 <= int(text) <= 65000):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected 0 or a port from 1024 to 65000")
    return int(text)


def running_state(root: Path) -> dict | None:
    """The running box's state, or None (no box, or one that died: its state file is stale)."""
    state = lay.read_state(root)
    return state if state and _alive(int(state.get("pid", 0))) else None


def need_box(root: Path) -> dict:
    state = running_state(root)
    if state is None:
        raise UsageError(f"no box is running in {root}; start one with `gpufleet box up` (or give --dir)")
    return state


def _free_ports(count: int) -> int:
    """A first port whose ``count`` consecutive ports are free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65000 and all(_port_free(base + i) for i in range(count)):
            return base
    raise UsageError("no free ports on 127.0.0.1 for the box; give --port")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def up(args) -> int:
    state = start(args.dir, args.nodes, args.port, args.stack)
    print(f"# box up in {state['dir']}: {args.nodes} CLOUD node(s) ({', '.join(state['nodes'])}), powered down "
          f"until a job needs them; bucket {state['bucket']}")
    for line in lay.exports(state):
        print(line)
    return 0


def start(root: Path, nodes: int = lay.DEFAULT_NODES, port: int = 0, stack: str = "dev") -> dict:
    """Start a box in ``root`` in the background and wait until it is up; its state. One-line UsageError when
    Slurm is missing, a box already runs there, a port is taken or the box could not start."""
    missing = [f"{cmd} ({pkg})" for cmd, pkg in NEEDS.items() if not shutil.which(cmd, path=_path())]
    if missing:
        raise UsageError(f"box: Slurm is not installed: {', '.join(missing)} missing; run `make tools` (as root) "
                         "or install the Debian packages slurm-wlm, slurmdbd, mariadb-server and munge")
    root = root.expanduser().resolve()
    state = running_state(root)
    if state is not None:
        raise UsageError(f"box: a box is already running in {root} (pid {state['pid']}); `gpufleet box down` first")
    layout = lay.Layout(root, nodes)
    need = len(layout.ports())
    if port:
        taken = [p for p in range(port, port + need) if not _port_free(p)]
        if taken:
            raise UsageError(f"--port: {', '.join(map(str, taken))} taken on 127.0.0.1; the box needs {need} "
                             f"consecutive free ports from {port}; choose another --port (or 0)")
        base = port
    else:
        base = _free_ports(need)
    if root.exists():
        for stale in ("state.json", "failed"):
            (root / stale).unlink(missing_ok=True)
        shutil.rmtree(layout.slurm / "state", ignore_errors=True)  # a box that died left its jobs behind
    root.mkdir(parents=True, exist_ok=True)
    out = open(root / "box.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "infra.box", "serve", "--dir", str(root), "--nodes",
                             str(nodes), "--port", str(base), "--stack", stack],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                            cwd=str(root), env=_child_env())
    out.close()
    deadline = time.monotonic() + UP_TIMEOUT_S
    while True:
        state = lay.read_state(root)
        if state is not None:
            return state
        failed = root / "failed"
        if proc.poll() is not None or failed.exists():
            proc.wait()
            why = failed.read_text().strip() if failed.exists() else f"exit status {proc.returncode}"
            raise UsageError(f"box: could not start: {why} (see {root / 'box.log'})")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            raise UsageError(f"box: not up after {UP_TIMEOUT_S:.0f} s (see {root / 'box.log'})")
        time.sleep(0.1)


def _path() -> str:
    return os.pathsep.join(filter(None, [os.environ.get("PATH"), "/usr/sbin", "/sbin"]))


def _child_env() -> dict[str, str]:
    from infra.demo.account import REPO  # lazy: boto3 (~0.2 s) off gpufleet's start-up

    env = dict(os.environ, PATH=_path())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def down(args) -> int:
    root = args.dir.expanduser().resolve()
    print(f"box in {root} stopped" if stop(root) else f"no box is running in {root}; nothing to stop")
    return 0


def stop(root: Path) -> bool:
    """Stop the box in ``root`` and every process it started; False if none was running."""
    state = running_state(root)
    if state is None:
        (root / "state.json").unlink(missing_ok=True)
        return False
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    from infra.box.supervisor import kill_box  # lazy: boto3 (~0.2 s) off gpufleet's start-up

    kill_box(state["box_id"])  # whatever a killed supervisor left behind
    (root / "state.json").unlink(missing_ok=True)
    return True


def env(args) -> int:
    for line in lay.exports(need_box(args.dir.expanduser().resolve())):
        print(line)
    return 0


def status(args) -> int:
    state = need_box(args.dir.expanduser().resolve())
    e = dict(os.environ, SLURM_CONF=state["slurm_conf"], PATH=_path())
    ping = subprocess.run(["scontrol", "ping"], env=e, capture_output=True, text=True).stdout.strip()
    print(f"box {state['dir']} (pid {state['pid']}), account {state['endpoint']}, bucket {state['bucket']}")
    print(f"controller: {ping or 'no answer'}")
    for title, argv in (("nodes", ["sinfo", "-N", "-o", "%N %T %E"]), ("jobs", ["squeue", "-o", "%i %j %T %M %N %r"])):
        done = subprocess.run(argv, env=e, capture_output=True, text=True)
        print(f"{title}:")
        for line in (done.stdout or done.stderr).splitlines():
            print(f"  {line}")
    return 0


def notice(args) -> int:
    state = need_box(args.dir.expanduser().resolve())
    send_notice(state, args.node)
    print(f"node {args.node}: spot interruption notice sent (its jobs are requeued and it powers down)")
    return 0


def send_notice(state: dict, node: str) -> None:
    """A spot interruption notice to the node (its fake metadata endpoint answers with it from now on)."""
    if node not in state["nodes"]:
        raise UsageError(f"notice: {node!r} is not a node of the box; expected one of {', '.join(state['nodes'])}")
    path = lay.Layout(Path(state["dir"])).notice_file(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"at": time.time()}))


def run(args: argparse.Namespace) -> int:
    return {"up": up, "down": down, "env": env, "status": status, "notice": notice}[args.box_command](args)
