"""`python -m infra.box serve --dir D --nodes N --port P --stack S`: the box's supervisor (what `box up` starts);
`python -m infra.box up|down|env|status|notice ...`: the same as `gpufleet box ...`."""
import argparse
import sys
from pathlib import Path

if sys.argv[1:2] == ["serve"]:
    from infra.box.supervisor import main

    p = argparse.ArgumentParser(prog="python -m infra.box serve")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stack", default="dev")
    a = p.parse_args(sys.argv[2:])
    sys.exit(main(a.dir, a.nodes, a.port, a.stack))

from infra.cli import main as cli_main

sys.exit(cli_main(["box", *sys.argv[1:]]))
