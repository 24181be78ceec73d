"""On a node: the job agent, torchrun launch, preflight checks, gang rendezvous, node metrics."""
