"""Tencent Cloud stack: a Slurm controller CVM, a launch template per partition (GN10Xp/GN7/GT4 nodes powered up by
Slurm), CFS for /home and the Slurm state, the munge key in SSM, a KMS-encrypted COS bucket, a TDMQ CMQ queue and
Cloud Monitor."""
