"""The hardening runs against a real webhook: the server under load and faults (harness), the soak."""
