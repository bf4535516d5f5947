"""The agent's NRI plugin: hands each fractional container its GPU devices at creation (docs/architecture.md)."""
