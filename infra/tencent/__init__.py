"""Tencent Cloud stack: GN10Xp/GN7/GT4 scaling group, KMS-encrypted COS bucket, TDMQ CMQ queue, Cloud Monitor."""
