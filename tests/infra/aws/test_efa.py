"""EFA interface layout per instance type (pure, from the catalog)."""
import pytest

from infra.aws import efa
from infra.catalog import CATALOG

GOLDEN = {"p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16,
          "g6e.48xlarge": 4, "g6e.24xlarge": 2, "g6e.12xlarge": 1, "g5.48xlarge": 1, "g5.8xlarge": 1,
          "g6.12xlarge": 1, "g5.xlarge": 0, "g6.xlarge": 0, "g6e.2xlarge": 0}


@pytest.mark.parametrize("name,count", sorted(GOLDEN.items()))
def test_efa_count_per_type(name, count):
    assert efa.efa_count(efa.layout(CATALOG[name])) == count


@pytest.mark.parametrize("name", [n for n, t in CATALOG.items() if t.cloud == "aws"])
def test_layout_follows_the_guidance(name):
    row = CATALOG[name]
    nics = efa.layout(row)
    primary = nics[0]
    assert (primary.network_card_index, primary.device_index) == (0, 0)
    assert sum(n.primary for n in nics) == 1
    assert primary.interface_type != efa.EFA_ONLY, "an EFA-only interface cannot be the primary"
    slots = [(n.network_card_index, n.device_index) for n in nics]
    assert len(set(slots)) == len(slots)
    assert all(n.network_card_index < row.network_cards for n in nics)
    assert efa.efa_count(nics) == min(row.max_efa, row.network_cards)
    # one EFA per card: every EFA-capable card used exactly once
    efa_cards = [n.network_card_index for n in nics if n.efa]
    assert sorted(efa_cards) == list(range(len(efa_cards)))


def test_multi_card_types_use_ena_primary_and_efa_only():
    nics = efa.layout(CATALOG["p5en.48xlarge"])
    assert nics[0] == efa.Interface(0, 0, efa.ENA)
    assert nics[1] == efa.Interface(0, 1, efa.EFA_ONLY)
    assert nics[2:] == tuple(efa.Interface(card, 0, efa.EFA_ONLY) for card in range(1, 16))
    assert len(nics) == 17


def test_single_card_efa_type_has_efa_primary():
    assert efa.layout(CATALOG["g6e.12xlarge"]) == (efa.Interface(0, 0, efa.EFA),)


def test_without_efa_or_efa_disabled_one_ena_interface():
    assert efa.layout(CATALOG["g5.xlarge"]) == (efa.Interface(0, 0, efa.ENA),)
    assert efa.layout(CATALOG["p5.48xlarge"], use_efa=False) == (efa.Interface(0, 0, efa.ENA),)
