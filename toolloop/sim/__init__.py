"""The provider simulator: Anthropic's Messages API and fal's OpenAI-compatible router on loopback,
driven by scripts or Python policies, with prompt-cache accounting, faults and latency.
See docs/simulator.md."""

from toolloop.sim.app import ANTHROPIC_PATH, FAL_PATH, Simulator
from toolloop.sim.cache import Block, CacheRequestError, CacheUsage, PromptCache
from toolloop.sim.script import (
    AFTER_SCRIPT,
    Policy,
    Script,
    SimFault,
    SimRefusal,
    SimRequest,
    SimToolCall,
    SimTurn,
    as_policy,
    load_script,
)
from toolloop.sim.server import SimServer

__all__ = [
    "AFTER_SCRIPT",
    "ANTHROPIC_PATH",
    "FAL_PATH",
    "Block",
    "CacheRequestError",
    "CacheUsage",
    "Policy",
    "PromptCache",
    "Script",
    "SimFault",
    "SimRefusal",
    "SimRequest",
    "SimServer",
    "SimToolCall",
    "SimTurn",
    "Simulator",
    "as_policy",
    "load_script",
]
