"""Rewards beyond code checks (docs/rewards.md): preference pairs, a Bradley–Terry reward model and an LLM judge,
and how their scores join an episode's reward."""
