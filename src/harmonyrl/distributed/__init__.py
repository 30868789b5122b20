"""Scaling out: the trainer under torch.distributed (FSDP2) and workers placed elsewhere."""
