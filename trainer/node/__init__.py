"""On a node: how a job runs (environment, containers, code bundles, the stop contract), the torchrun launcher,
preflight checks, registry logins, node metrics and the node platform."""
