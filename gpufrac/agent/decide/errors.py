"""One error type per kind of failure the agent meets at its edges."""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class NvmlError(AgentError):
    """NVML could not be loaded or answered with an error (no driver, GPU lost, ...)."""


class ProcReadError(AgentError):
    """A /proc entry of a GPU process could not be read (it exited, or no permission: hostPID missing?)."""


class MpsStartError(AgentError):
    """An MPS control daemon could not be started (binary missing, directory not writable)."""


class ConfigError(AgentError):
    """The agent's own flags are inconsistent or unusable."""
