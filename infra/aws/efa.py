"""Network-interface layout of a node's launch template, derived from the catalog row.

AWS guidance for EFA on instances with several network cards (EC2 user guide, "Maximize network
bandwidth on Amazon EC2 instances with multiple network cards"): the primary interface (card 0,
device 0) is a plain ENA interface; an EFA-only interface goes on card 0 at device index 1 when
card 0 supports EFA, and every further card gets an EFA-only interface at device index 0. EFA-only
interfaces carry no IP address (SRD runs over MAC addresses), so a p5.48xlarge uses one private IP
for 32 EFA devices. A single-card EFA type (g5.8xlarge and up, g6e.12xlarge) gets one
EFA-with-ENA interface as its primary. Types without EFA get one ENA interface.
"""
from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import InstanceType

ENA, EFA, EFA_ONLY = "interface", "efa", "efa-only"


@dataclass(frozen=True)
class Interface:
    network_card_index: int
    device_index: int
    interface_type: str  # ENA ("interface"), EFA ("efa", EFA with ENA) or EFA_ONLY ("efa-only")

    @property
    def primary(self) -> bool:
        return self.network_card_index == 0 and self.device_index == 0

    @property
    def efa(self) -> bool:
        return self.interface_type in (EFA, EFA_ONLY)


def layout(row: InstanceType, use_efa: bool = True) -> tuple[Interface, ...]:
    """The interfaces of one node of type `row`: one EFA per EFA-capable card, up to max_efa."""
    if not use_efa or row.max_efa == 0:
        return (Interface(0, 0, ENA),)
    cards = min(row.network_cards, row.max_efa)
    if cards == 1:
        return (Interface(0, 0, EFA),)
    return (Interface(0, 0, ENA), Interface(0, 1, EFA_ONLY),
            *(Interface(card, 0, EFA_ONLY) for card in range(1, cards)))


def efa_count(interfaces: tuple[Interface, ...]) -> int:
    return sum(1 for nic in interfaces if nic.efa)
