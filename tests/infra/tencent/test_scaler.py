"""The queue-mode scaler function against a fake of API 3.0 on loopback (tests/trainer/fake_tencent.py, written
from Tencent's documentation: every request's TC3 signature is checked), in this process and as SCF runs it:
from its zip, with nothing but the standard library."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import pytest

from infra.tencent import scaler_fn
from infra.tencent.scaler import scaler_zip
from tests.trainer.fake_tencent import KEY, FakeApi3, Refused
from trainer.clouds.tencent_api import Api, ApiError, StaticCredentials


@pytest.fixture
def api():
    with FakeApi3() as fake:
        fake.queue = {"ActiveMsgNum": 0, "InactiveMsgNum": 0}
        fake.desired = []

        def describe(p):
            if p != {"QueueName": "gpufleet-t-jobs"}:
                raise Refused("ResourceNotFound", f"no queue {p}")
            return {"QueueDescribe": {"QueueName": p["QueueName"], **fake.queue}}

        def modify(p):
            fake.desired.append((p["AutoScalingGroupId"], p["DesiredCapacity"]))
            return {}

        fake.handlers[("tdmq", "DescribeCmqQueueDetail")] = describe
        fake.handlers[("as", "ModifyDesiredCapacity")] = modify
        yield fake


def client(fake) -> Api:
    return Api(StaticCredentials(KEY), "ap-shanghai", endpoint=fake.endpoint)


@pytest.mark.parametrize("waiting, running, desired", [(0, 0, 0), (2, 1, 3), (9, 3, 4)])
def test_nodes_follow_waiting_plus_running_jobs_within_the_bounds(api, waiting, running, desired):
    api.queue = {"ActiveMsgNum": waiting, "InactiveMsgNum": running}
    result = scaler_fn.scale(client(api), "gpufleet-t-jobs", "asg-1a2b3c4d", 0, 4)
    assert result == {"waiting": waiting, "running": running, "desired": desired}
    assert api.desired == [("asg-1a2b3c4d", desired)]
    assert [(s, a) for s, a, _ in api.calls] == [("tdmq", "DescribeCmqQueueDetail"), ("as", "ModifyDesiredCapacity")]


def test_an_api_error_stops_the_pass_before_the_group_is_touched(api):
    with pytest.raises(ApiError, match="ResourceNotFound"):
        scaler_fn.scale(client(api), "other-queue", "asg-1a2b3c4d", 0, 4)
    assert api.desired == []


def test_a_wrong_key_is_refused_by_the_signature_check(api):
    from trainer.clouds.tencent_api import Credentials

    wrong = Api(StaticCredentials(Credentials(KEY.secret_id, "not-the-key", KEY.token)), "ap-shanghai",
                endpoint=api.endpoint)
    with pytest.raises(ApiError, match="AuthFailure.SignatureFailure"):
        scaler_fn.scale(wrong, "gpufleet-t-jobs", "asg-1a2b3c4d", 0, 4)


def test_the_zip_runs_with_the_standard_library_alone(api, tmp_path):
    zipfile.ZipFile(io.BytesIO(scaler_zip())).extractall(tmp_path)
    assert scaler_zip() == scaler_zip()  # the same bytes every time: an unchanged function is not redeployed
    api.queue = {"ActiveMsgNum": 1, "InactiveMsgNum": 0}
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import scaler_fn, tencent_api, json\n"
            "assert 'infra' not in sys.modules and 'trainer' not in sys.modules\n"
            f"api = tencent_api.Api(tencent_api.StaticCredentials(tencent_api.Credentials({KEY.secret_id!r}, "
            f"{KEY.secret_key!r}, {KEY.token!r})), 'ap-shanghai', endpoint={api.endpoint!r})\n"
            "print(json.dumps(scaler_fn.scale(api, 'gpufleet-t-jobs', 'asg-1a2b3c4d', 0, 4)))\n")
    # -S -I: no site-packages, no PYTHONPATH, no current directory: only the zip and the standard library.
    proc = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"waiting": 1, "running": 0, "desired": 1}
    assert api.desired == [("asg-1a2b3c4d", 1)]


def test_the_handler_reads_the_function_role_key_from_the_environment(monkeypatch):
    with pytest.raises(RuntimeError, match="no key in the environment"):
        scaler_fn.main_handler({}, None, env={"GPUFLEET_REGION": "ap-shanghai"})
