"""The NRI door: the agent's NRI plugin hands each fractional container its GPU devices at creation, and gives every
other container none (docs/architecture.md). Its service, its edges (the runtime's connection, NRI's wire) and its
pure decisions (decide/)."""
