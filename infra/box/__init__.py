"""The cluster in a box: a real Slurm (slurmctld, CLOUD nodes as local slurmd), the bridge, moto for the
account and a fake metadata endpoint per node, all on loopback under one directory (`gpufleet box`)."""
