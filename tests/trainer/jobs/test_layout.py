"""Where a team's things lie in the bucket (trainer.jobs.layout): pure derivations."""
import pytest

from trainer.errors import UsageError
from trainer.jobs.layout import job_uri, team_base, team_of_account, team_prefix


def test_a_jobs_prefix_is_under_its_team_on_every_cloud():
    assert job_uri("ckpt", "vision", "j2") == "s3://ckpt/teams/vision/jobs/j2/"
    assert job_uri("https://acct.blob.core.windows.net/ckpt/", "nlp", "j2") == \
        "https://acct.blob.core.windows.net/ckpt/teams/nlp/jobs/j2/"
    assert job_uri("cos://ckpt-1250000000", "nlp", "j2") == "cos://ckpt-1250000000/teams/nlp/jobs/j2/"
    assert job_uri("ckpt", None, "j2") == "s3://ckpt/teams/default/jobs/j2/"  # no team named: the default team
    assert team_base("az://ckpt", "vision") == "az://ckpt/teams/vision/"


@pytest.mark.parametrize("bad", ["../nlp", "Vision", "nlp/", "a" * 16, "1team", "nlp\n", ""])
def test_a_name_that_is_no_teams_is_one_line_never_a_path(bad):
    if bad == "":  # empty is "none named": the default team
        assert team_prefix(bad) == "teams/default/"
        return
    with pytest.raises(UsageError, match=r"^team .* is not a team name \(1-15 lowercase letters and digits"):
        team_prefix(bad)


def test_a_slurm_account_that_is_no_team_name_is_the_default_teams():
    assert team_of_account("nlp") == "nlp"
    assert team_of_account("") == team_of_account(None) == team_of_account("ml-ops") == "default"
