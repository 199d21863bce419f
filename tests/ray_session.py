"""The shape of the test run's one Ray cluster (the `ray_cluster` fixture): two nodes on this machine."""

GPUS_PER_NODE = 4  # declared on each node; model replicas run on the CPU
