"""Teams as Slurm accounts (trainer.slurm.accounts): what the accounting must hold, derived from what it holds.
The box's tests run these commands against a real slurmdbd and MariaDB (tests/infra/box)."""
from __future__ import annotations

import subprocess

import pytest

from trainer.errors import Fault, UsageError
from tests.trainer.slurm.test_users import colliding_names
from trainer.slurm import users
from trainer.slurm.accounts import (Association, Dbd, Team, apply, changes, database_grants, parse_associations,
                                    render_slurmdbd_conf, teams_of)

VISION, NLP = Team("vision", 2), Team("nlp", 1, 1)
SHOWN = ("root|||\nroot|root|1|\nvision||2|\nvision|gpufleet-vision|1|\nvision|alice|1|\nnlp||1|gres/gpu=1\n"
         "nlp|gpufleet-nlp|1|\n")


def test_an_empty_accounting_gets_each_team_with_its_own_user_and_the_submitters():
    assert changes([], [VISION, NLP], ["alice"]) == [
        ["add", "account", "vision", "Description=gpufleet team vision", "Fairshare=2", "GrpTRES=gres/gpu=-1"],
        ["add", "user", "gpufleet-vision", "account=vision"],
        ["add", "user", "alice", "account=vision"],
        ["add", "account", "nlp", "Description=gpufleet team nlp", "Fairshare=1", "GrpTRES=gres/gpu=1"],
        ["add", "user", "gpufleet-nlp", "account=nlp"],
        ["add", "user", "alice", "account=nlp"]]


def test_a_teams_user_is_in_its_own_account_only():
    made = changes([], [VISION, NLP], [])
    assert [c for c in made if c[:2] == ["add", "user"]] == [
        ["add", "user", "gpufleet-vision", "account=vision"], ["add", "user", "gpufleet-nlp", "account=nlp"]]


def test_what_the_accounting_holds_already_is_not_done_again():
    held = parse_associations(SHOWN)
    assert held[2] == Association("vision", "", "2", "")
    assert changes(held, [VISION, NLP], ["alice"]) == [["add", "user", "alice", "account=nlp"]]
    assert changes(held + [Association("nlp", "alice", "1", "")], [VISION, NLP], ["alice"]) == []


def test_a_changed_share_or_limit_is_modified_and_a_removed_limit_cleared():
    held = parse_associations(SHOWN)
    assert changes(held, [Team("vision", 5, 8), Team("nlp", 1)], []) == [
        ["modify", "account", "where", "name=vision", "set", "Fairshare=5", "GrpTRES=gres/gpu=8"],
        ["modify", "account", "where", "name=nlp", "set", "Fairshare=1", "GrpTRES=gres/gpu=-1"]]


def test_a_team_gone_from_the_config_is_left_to_its_running_jobs():
    assert changes(parse_associations(SHOWN), [VISION], ["alice"]) == []


@pytest.mark.parametrize("bad, message", [
    (dict(name="Vision"), "team 'Vision': expected 1-15 lowercase letters and digits, starting with a letter"),
    (dict(name="vision\n"), "team 'vision\\n': expected 1-15 lowercase letters and digits, starting with a letter"),
    (dict(name="a", fair_share=0), "team a: fair share 0; expected a whole number >= 1"),
    (dict(name="a", gpu_limit=-1), "team a: GPU limit -1; expected a whole number >= 0"),
])
def test_a_bad_team_is_one_line(bad, message):
    with pytest.raises(UsageError) as exc:
        Team(**bad)
    assert str(exc.value) == message


def test_teams_from_json_default_to_one_team_and_refuse_a_repeated_name():
    assert teams_of([]) == (Team("default"),)
    assert teams_of([{"name": "nlp", "fair_share": 1, "gpu_limit": 1}, {"name": "vision"}]) == (NLP, Team("vision"))
    with pytest.raises(UsageError) as exc:
        teams_of([{"name": "nlp"}, {"name": "nlp"}])
    assert str(exc.value) == "teams: names repeat (nlp, nlp); expected each team once"
    a, b = colliding_names()
    with pytest.raises(UsageError) as exc:
        teams_of([{"name": a}, {"name": b}])
    assert str(exc.value) == f"teams {a} and {b} would have one Unix uid ({users.uid_of(a)}); rename one"


def test_apply_reads_then_runs_only_what_is_missing_and_a_refusal_is_one_line():
    ran = []

    def sacctmgr(argv, **_):
        ran.append(argv)
        if argv[1:3] == ["-n", "-P"]:
            return subprocess.CompletedProcess(argv, 0, SHOWN, "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert apply([VISION, NLP], ["alice"], run=sacctmgr) == [["add", "user", "alice", "account=nlp"]]
    assert ran == [["sacctmgr", "-n", "-P", "show", "associations", "format=account,user,fairshare,grptres"],
                   ["sacctmgr", "-i", "add", "user", "alice", "account=nlp"]]

    def refusing(argv, **_):
        return subprocess.CompletedProcess(argv, 1, "", "sacctmgr: error: slurmdb_format_tres_str: no TRES known "
                                           "by type gres/gpu\n Unknown option: GrpTRES=gres/gpu=1\n")
    with pytest.raises(Fault) as exc:
        apply([NLP], [], run=refusing)
    assert str(exc.value).startswith("accounts: sacctmgr -n -P show associations format=account,user,fairshare,"
                                     "grptres: sacctmgr: error: slurmdb_format_tres_str: no TRES known")


def test_slurmdbd_conf_and_the_database_grants():
    dbd = Dbd(port=6819, storage_port=3306, storage_user="slurm", storage_pass="0123456789abcdef0123",
              slurm_user="slurm", log_file="/var/log/slurm/slurmdbd.log", pid_file="/run/slurmdbd.pid")
    conf = dict(ln.split("=", 1) for ln in render_slurmdbd_conf(dbd).splitlines() if not ln.startswith("#"))
    assert conf == {"AuthType": "auth/munge", "DbdHost": "localhost", "DbdAddr": "127.0.0.1", "DbdPort": "6819",
                    "SlurmUser": "slurm", "StorageType": "accounting_storage/mysql", "StorageHost": "127.0.0.1",
                    "StoragePort": "3306", "StorageUser": "slurm", "StoragePass": "0123456789abcdef0123",
                    "StorageLoc": "slurm_acct_db", "LogFile": "/var/log/slurm/slurmdbd.log",
                    "PidFile": "/run/slurmdbd.pid"}
    sql = database_grants(dbd)
    assert "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" in sql
    with pytest.raises(UsageError):
        database_grants(Dbd(6819, 3306, "slurm'; DROP", "0123456789abcdef0123", "slurm", "l", "p"))
    with pytest.raises(UsageError):
        database_grants(Dbd(6819, 3306, "slurm", "short", "slurm", "l", "p"))
