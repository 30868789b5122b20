"""The supervised warm start.

- ``warm_start``: the phase (the user's file, a user expert, the env's scripted expert, a team's roles).
- ``train``: the SFT update, with the same rendering and loss mask as RL.
- ``demos``, ``demo_files``, ``demo_fit``, ``demo_report``, ``team_demos``: demonstrations read, checked,
  replayed through the env's tools, and reported once.
"""
