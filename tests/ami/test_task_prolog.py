"""The image's Slurm TaskProlog hands every task the node's NCCL/EFA settings and, where the Prolog granted the job
credentials of its own, the AWS container-credentials variables (Slurm sets what it prints). Run for real."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "ami" / "files" / "gpufleet-task-prolog.sh"
NCCL_ENV = """# Written by ami/scripts/60-nccl-env.sh at bake time: efa-installer=1.41.0
FI_PROVIDER=efa
FI_EFA_FORK_SAFE=1
NCCL_SOCKET_IFNAME=^docker,lo
NCCL_NET_PLUGIN=ofi
LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64
"""


ENDPOINT = "http://127.0.0.1:51680/v1/credentials"
TOKEN = "4242." + "aZ09_-" * 7 + "Q"  # <Slurm job id>.<43 of [A-Za-z0-9_-]>
NCCL_EXPORTS = [
    "export FI_PROVIDER=efa", "export FI_EFA_FORK_SAFE=1", "export NCCL_SOCKET_IFNAME=^docker,lo",
    "export NCCL_NET_PLUGIN=ofi",
    "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64"]


def credential_lines(endpoint: str, token: str) -> list[str]:
    return ["unset AWS_ACCESS_KEY_ID", "unset AWS_SECRET_ACCESS_KEY", "unset AWS_SESSION_TOKEN", "unset AWS_PROFILE",
            "unset AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "unset TENCENTCLOUD_SECRET_ID",
            "unset TENCENTCLOUD_SECRET_KEY", "unset TENCENTCLOUD_SESSION_TOKEN",
            f"export AWS_CONTAINER_CREDENTIALS_FULL_URI={endpoint}",
            f"export AWS_CONTAINER_AUTHORIZATION_TOKEN={token}"]


def prolog(settings: Path, *more: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PROLOG), str(settings), *more], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], **env})


def test_each_setting_is_an_export_and_the_tasks_library_path_comes_after_the_nodes(tmp_path):
    settings = tmp_path / "nccl.env"
    settings.write_text(NCCL_ENV)
    done = prolog(settings, LD_LIBRARY_PATH="/home/me/lib")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == [
        "export FI_PROVIDER=efa", "export FI_EFA_FORK_SAFE=1", "export NCCL_SOCKET_IFNAME=^docker,lo",
        "export NCCL_NET_PLUGIN=ofi",
        "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64:/home/me/lib"]
    assert prolog(settings).stdout.splitlines()[-1] == (
        "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64")


def test_no_settings_file_no_exports_and_odd_lines_are_skipped(tmp_path):
    assert prolog(tmp_path / "absent").stdout == ""
    settings = tmp_path / "nccl.env"
    settings.write_text("not a setting\n1BAD=x\nA-B=y\nNCCL_IB_DISABLE=1")  # and no newline at the end
    assert prolog(settings).stdout == "export NCCL_IB_DISABLE=1\n"


def test_the_image_installs_it_where_slurm_conf_names_it():
    from trainer.slurm.conf import IMAGE_TASK_PROLOG

    script = (ROOT / "ami" / "scripts" / "45-slurm.sh").read_text()
    assert f"files/gpufleet-task-prolog.sh {IMAGE_TASK_PROLOG}" in script


@pytest.fixture
def node(tmp_path) -> tuple[Path, Path]:
    """The node's NCCL settings and a credentials directory with an empty tokens/ (as the Prolog leaves it)."""
    settings = tmp_path / "nccl.env"
    settings.write_text(NCCL_ENV)
    credentials = tmp_path / "credentials"
    (credentials / "tokens").mkdir(parents=True)
    return settings, credentials


def test_a_job_with_a_token_gets_its_own_credentials_after_the_nccl_settings(node):
    settings, credentials = node
    (credentials / "tokens" / "4242").write_text(TOKEN)
    done = prolog(settings, str(credentials), ENDPOINT, SLURM_JOB_ID="4242")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == NCCL_EXPORTS + credential_lines(ENDPOINT, TOKEN)
    (credentials / "tokens" / "4242").write_text(TOKEN + "\n")  # a trailing newline is no part of the token
    other = "http://127.0.0.1:9/v1/credentials"
    assert prolog(settings, str(credentials), other, SLURM_JOB_ID="4242").stdout.splitlines()[-10:] == (
        credential_lines(other, TOKEN))


@pytest.mark.parametrize("cloud", ["azure", "aws", "tencent"])
def test_on_azure_the_token_reaches_the_endpoint_as_app_service_hands_an_identity(node, tmp_path, cloud):
    """azure-identity's ManagedIdentityCredential (App Service) reads IDENTITY_ENDPOINT and IDENTITY_HEADER; what
    would win over them (a service principal's secret, another host's managed identity) is unset. AWS's and
    Tencent's nodes keep AWS's variables."""
    settings, credentials = node
    (credentials / "tokens" / "4242").write_text(TOKEN)
    node_json = tmp_path / "node.json"
    node_json.write_text(json.dumps({"cloud": cloud, "region": "r"}))
    done = prolog(settings, str(credentials), ENDPOINT, str(node_json), SLURM_JOB_ID="4242")
    assert done.returncode == 0 and done.stderr == ""
    if cloud != "azure":
        assert done.stdout.splitlines() == NCCL_EXPORTS + credential_lines(ENDPOINT, TOKEN)
        return
    assert done.stdout.splitlines() == NCCL_EXPORTS + [
        "unset AZURE_CLIENT_SECRET", "unset AZURE_CLIENT_CERTIFICATE_PATH", "unset AZURE_USERNAME",
        "unset AZURE_PASSWORD", "unset AZURE_FEDERATED_TOKEN_FILE", "unset IDENTITY_SERVER_THUMBPRINT",
        "unset IMDS_ENDPOINT", "unset MSI_ENDPOINT", "unset MSI_SECRET",
        "export IDENTITY_ENDPOINT=http://127.0.0.1:51680/msi/token", f"export IDENTITY_HEADER={TOKEN}"]
    node_json.unlink()
    node_json.symlink_to(tmp_path / "elsewhere.json")  # a link is not the node's settings: AWS's variables
    (tmp_path / "elsewhere.json").write_text(json.dumps({"cloud": "azure"}))
    again = prolog(settings, str(credentials), ENDPOINT, str(node_json), SLURM_JOB_ID="4242")
    assert again.stdout.splitlines() == NCCL_EXPORTS + credential_lines(ENDPOINT, TOKEN)


def test_credentials_without_nccl_settings(node, tmp_path):
    _, credentials = node
    (credentials / "tokens" / "4242").write_text(TOKEN)
    done = prolog(tmp_path / "absent", str(credentials), ENDPOINT, SLURM_JOB_ID="4242")
    assert done.returncode == 0 and done.stdout.splitlines() == credential_lines(ENDPOINT, TOKEN)


@pytest.mark.parametrize("content", [
    "", "4242", "4242.", TOKEN[:-1], TOKEN + "A", TOKEN[:-1] + "+", TOKEN[:-1] + "=", "x" + TOKEN,
    TOKEN.replace("4242.", "4242:"), TOKEN.replace("4242", "42a2"), TOKEN[:20] + " " + TOKEN[21:],
    TOKEN + "\nexport EVIL=1", "export EVIL=1\n" + TOKEN, TOKEN[:-1] + "\u00e9",
], ids=lambda c: repr(c[:12]) + f"..{len(c)}")
def test_a_token_file_holding_anything_but_a_token_is_ignored(node, content):
    settings, credentials = node
    (credentials / "tokens" / "4242").write_text(content)
    done = prolog(settings, str(credentials), ENDPOINT, SLURM_JOB_ID="4242")
    assert done.returncode == 0 and done.stdout.splitlines() == NCCL_EXPORTS  # nothing of credentials


def test_a_token_file_that_is_a_link_is_ignored(node, tmp_path):
    settings, credentials = node
    elsewhere = tmp_path / "planted"
    elsewhere.write_text(TOKEN)
    (credentials / "tokens" / "4242").symlink_to(elsewhere)
    done = prolog(settings, str(credentials), ENDPOINT, SLURM_JOB_ID="4242")
    assert done.returncode == 0 and done.stdout.splitlines() == NCCL_EXPORTS


def test_no_token_file_or_no_tokens_directory_no_credentials(node, tmp_path):
    settings, credentials = node
    (credentials / "tokens" / "4243").write_text(TOKEN)  # another job's
    for directory in (credentials, tmp_path / "absent"):
        done = prolog(settings, str(directory), ENDPOINT, SLURM_JOB_ID="4242")
        assert done.returncode == 0 and done.stdout.splitlines() == NCCL_EXPORTS


@pytest.mark.parametrize("job", [None, "", "42a2", "4242 ", " 4242", "-4242", "../tokens/4242", "4242/", "4242\n1"])
def test_a_job_id_that_is_not_digits_gets_no_credentials(node, job):
    settings, credentials = node
    (credentials / "tokens" / "4242").write_text(TOKEN)
    env = {} if job is None else {"SLURM_JOB_ID": job}
    done = prolog(settings, str(credentials), ENDPOINT, **env)
    assert done.returncode == 0 and done.stdout.splitlines() == NCCL_EXPORTS


def test_the_defaults_are_where_the_credentials_daemon_and_prolog_work():
    from trainer.node import jobcreds

    text = PROLOG.read_text()
    assert f'credentials="${{2:-{jobcreds.DIR}}}"' in text
    assert f'endpoint="${{3:-http://{jobcreds.HOST}:{jobcreds.PORT}{jobcreds.PATH}}}"' in text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the token file is another user's (its own uid, 0400)")
def test_the_prologs_token_file_is_read_by_the_jobs_user_and_by_no_one_else():
    """The grant trainer.node.jobcreds writes as root (the Prolog): the TaskProlog, run as the job's user, hands
    the token on; run as another user it cannot read it and prints nothing of credentials."""
    from trainer.node import jobcreds

    work = Path(tempfile.mkdtemp(prefix="gpufleet-task-prolog-"))
    try:
        work.chmod(0o755)  # both users reach the script and the directory, as on a node
        script = work / "gpufleet-task-prolog"
        shutil.copy(PROLOG, script)
        script.chmod(0o755)
        credentials = work / "credentials"
        token = jobcreds.write_grant(credentials, "4242", "vision", "job-1", 65534, 65534)
        assert jobcreds.TOKEN.fullmatch(token)
        for uid, expected in ((65534, credential_lines(ENDPOINT, token)), (65533, [])):
            done = subprocess.run(
                [shutil.which("setpriv") or "setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                 "bash", str(script), str(work / "absent"), str(credentials), ENDPOINT],
                capture_output=True, text=True, timeout=30, cwd=work,
                env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242"})
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == expected, uid
    finally:
        shutil.rmtree(work)
