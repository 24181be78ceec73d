"""The box's layout (pure): every Unix socket a box makes fits Linux's 108 bytes, however deep its --dir."""
from __future__ import annotations

from pathlib import Path

from infra.box import layout as lay

SUN_PATH = 108  # sizeof(sockaddr_un.sun_path), the terminating NUL included


def test_sockets_fit_a_socket_path_for_a_deep_dir():
    deep = Path("/tmp") / ("d" * 60) / ("e" * 60) / "box"
    L = lay.Layout(deep, nodes=16)
    longest_step = L.spool_dir / "gpu-16" / "gpu-16_99999999.4294967291"  # slurmstepd's, as slurmd names it
    for socket in (L.munge_socket, longest_step):
        assert len(str(socket)) < SUN_PATH, socket
    assert L.sockets != lay.Layout(deep.parent / "other").sockets  # one per box
    assert lay.cluster(L).spool_dir == str(L.spool_dir)
