"""`pip wheel trainer/` builds the wheel the templates bake, with the entry points the units start."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.ami.conftest import image_commands


def _wheel(trainer_wheel_dir, manifest) -> zipfile.ZipFile:
    path = trainer_wheel_dir / manifest["trainer"]["wheel"]
    assert path.exists(), f"expected {path.name}, got {[p.name for p in trainer_wheel_dir.iterdir()]}"
    return zipfile.ZipFile(path)


def test_wheel_is_named_by_the_manifest_and_declares_the_console_script(trainer_wheel_dir, manifest):
    with _wheel(trainer_wheel_dir, manifest) as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "gpufleet-trainer = trainer.__main__:main" in entry_points
    assert {"trainer/__init__.py", "trainer/loop/train.py", "trainer/slurm/setup.py", "trainer/jobs/queue.py",
            "trainer/jobs/job.schema.json", "trainer/clouds/aws.py", "trainer/clouds/azure.py",
            "trainer/clouds/tencent.py", "trainer/clouds/tencent_api.py"} <= set(names)


def test_wheel_contains_the_module_entry_point(trainer_wheel_dir, manifest):
    with _wheel(trainer_wheel_dir, manifest) as wheel:
        assert "trainer/__main__.py" in wheel.namelist()


def test_installed_wheel_runs_the_commands_the_units_start(trainer_wheel_dir, manifest, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(trainer_wheel_dir / manifest["trainer"]["wheel"])], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    commands = sorted(image_commands())  # the units', Slurm's power saving programs' and the batch script's
    assert {"setup", "controller", "nodes", "task"} <= set(commands)
    for command in commands:
        result = subprocess.run([sys.executable, "-m", "trainer", command, "--help"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    where = subprocess.run([sys.executable, "-c", "import trainer; print(trainer.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(target))
