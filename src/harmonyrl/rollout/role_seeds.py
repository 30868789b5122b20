"""The sampling seed of each role of a team request: shared by the relay's roles (:mod:`.team`) and a game's seats
(:mod:`.seats`), so a seat samples exactly as the same role of a relay would."""

from __future__ import annotations

import hashlib


def role_seed(seed: int, role: int) -> int:
    """Role ``role``'s sampling seed for a request with ``seed`` (role 0: ``seed`` itself)."""
    if role == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:role{role}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF
