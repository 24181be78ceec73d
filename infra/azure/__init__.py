"""Azure stack: a Slurm cluster (controller VM, partitions of ND-series nodes made by its node provider), Azure
Files NFS for /home and slurmctld's state, locked-down storage, Key Vault, registry."""
