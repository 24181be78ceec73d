"""A private endpoint for one resource's sub-resource in the node subnet, with its private DNS zone linked to the
VNet and the endpoint's records in it: how the nodes, which have no internet access, reach the registry and the
Key Vault while both answer nothing from the public network."""
from __future__ import annotations

import pulumi
from pulumi_azure_native import network, privatedns


def private_endpoint(name: str, *, endpoint_name: str, link_name: str, target_id: pulumi.Input[str], group: str,
                     zone: str, resource_group: pulumi.Input[str], location: str, subnet_id: pulumi.Input[str],
                     vnet_id: pulumi.Input[str], tags: dict, opts: pulumi.ResourceOptions) -> network.PrivateEndpoint:
    """Children ``<name>-endpoint``, ``-dns``, ``-dns-link``, ``-dns-records`` under ``opts``' parent."""
    endpoint = network.PrivateEndpoint(
        f"{name}-endpoint",
        private_endpoint_name=endpoint_name,
        resource_group_name=resource_group,
        location=location,
        subnet={"id": subnet_id},
        private_link_service_connections=[network.PrivateLinkServiceConnectionArgs(
            name=group, private_link_service_id=target_id, group_ids=[group])],
        tags=tags,
        opts=opts,
    )
    dns = privatedns.PrivateZone(
        f"{name}-dns",
        private_zone_name=zone,
        resource_group_name=resource_group,
        location="global",              # private DNS zones are global resources
        tags=tags,
        opts=opts,
    )
    privatedns.VirtualNetworkLink(
        f"{name}-dns-link",
        virtual_network_link_name=link_name,
        private_zone_name=dns.name,
        resource_group_name=resource_group,
        location="global",
        virtual_network=privatedns.SubResourceArgs(id=vnet_id),
        registration_enabled=False,
        tags=tags,
        opts=opts,
    )
    network.PrivateDnsZoneGroup(
        f"{name}-dns-records",
        private_dns_zone_group_name=group,
        private_endpoint_name=endpoint.name,
        resource_group_name=resource_group,
        private_dns_zone_configs=[network.PrivateDnsZoneConfigArgs(
            name=zone.replace(".", "-"), private_dns_zone_id=dns.id)],
        opts=opts,
    )
    return endpoint
