"""One typed, validated, immutable config tree.

Loaded once from YAML (optional) plus dotted ``key=value`` overrides, validated by pydantic, and never
mutated afterwards (invariant 6). Unknown keys are errors that name the nearest valid key. Derived values
are properties. One module per section (``model``, ``sft``, ``rollout``, ``rl``, ``observe``: eval and
telemetry, ``env_runtime``: scale and env_faults); ``run`` assembles them with the checks that span sections,
``files`` reads and writes them. The env section's union lives with the bundled tasks (``tasks/config.py``).
"""

from harmonyrl.config.env_runtime import FaultInjectionConfig, ScaleConfig
from harmonyrl.config.files import MOVED_KEYS, dump_config, load_config
from harmonyrl.config.model import LoraConfig, LoraTarget, ModelConfig
from harmonyrl.config.observe import EvalConfig, TelemetryConfig
from harmonyrl.config.rl import AsyncConfig, RLConfig
from harmonyrl.config.rollout import FaultBreakerConfig, RolloutConfig
from harmonyrl.config.run import RunConfig
from harmonyrl.config.sft import SFTConfig
from harmonyrl.config_tree import ConfigError, merge_trees, parse_override

__all__ = [
    "MOVED_KEYS",
    "AsyncConfig",
    "ConfigError",
    "EvalConfig",
    "FaultBreakerConfig",
    "FaultInjectionConfig",
    "LoraConfig",
    "LoraTarget",
    "ModelConfig",
    "RLConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "ScaleConfig",
    "TelemetryConfig",
    "dump_config",
    "load_config",
    "merge_trees",
    "parse_override",
]
