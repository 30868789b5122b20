"""Scale-out: pieces of a run placed on other processes or machines (Ray env workers, the FSDP learner)."""
