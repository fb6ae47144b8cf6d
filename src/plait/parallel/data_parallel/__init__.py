"""Data parallelism and ZeRO: the replicas, their gradient buckets, sharded optimizer state and FSDP2."""
