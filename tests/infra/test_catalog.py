"""The instance catalog: golden hardware facts, prices with their date, and refresh against EC2 (moto)."""
from __future__ import annotations

import boto3
import pytest

from infra import catalog

GOLDEN_EFA = {"p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32,
              "p5en.48xlarge": 16, "g6e.48xlarge": 4, "g6e.24xlarge": 2, "g5.48xlarge": 1,
              "g5.xlarge": 0, "g6.xlarge": 0}


@pytest.mark.parametrize("name,efa", GOLDEN_EFA.items())
def test_golden_efa_counts(name, efa):
    assert catalog.lookup(name).max_efa == efa


def test_required_families_present():
    for prefix in ("g5.", "g6.", "g6e.", "p4d.", "p4de.", "p5.", "p5e.", "p5en."):
        assert any(n.startswith(prefix) for n in catalog.names("aws")), prefix
    azure = catalog.names("azure")
    assert "Standard_ND96asr_v4" in azure and "Standard_ND96isr_H100_v5" in azure


def test_nvswitch_marks_fabric_manager_types():
    assert catalog.lookup("p5.48xlarge").nvswitch and catalog.lookup("p4d.24xlarge").nvswitch
    assert not catalog.lookup("g6e.48xlarge").nvswitch


def test_azure_rows_have_infiniband_and_no_efa():
    for name in catalog.names("azure"):
        row = catalog.lookup(name)
        assert row.infiniband_gbps >= 1600 and row.max_efa == 0 and row.rdma


def test_prices_are_positive_dated_and_spot_is_cheaper():
    assert catalog.PRICE_DATE[:4].isdigit()
    for row in catalog.CATALOG.values():
        assert row.price_hour > 0
        assert 0 < row.spot_price_hour < row.price_hour


def test_refresh_against_ec2_endpoint_finds_no_difference(moto_endpoint):
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)
    assert catalog.refresh(ec2) == {}


def test_refresh_reports_a_changed_fact(moto_endpoint, monkeypatch):
    wrong = catalog.InstanceType(**{**catalog.lookup("p5.48xlarge").__dict__, "max_efa": 31})
    monkeypatch.setitem(catalog.CATALOG, "p5.48xlarge", wrong)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)
    assert catalog.refresh(ec2) == {"p5.48xlarge": {"max_efa": (31, 32)}}


def test_refresh_cli_exit_status(moto_endpoint, capsys):
    assert catalog.main(["refresh"]) == 0
    assert "0 differ" in capsys.readouterr().out
