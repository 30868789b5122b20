"""harmonyrl: agentic reinforcement learning for GPT-OSS-style models."""

__version__ = "0.1.0"
