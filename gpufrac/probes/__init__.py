"""What both programs serve besides their own work: metrics and probes over plain HTTP (server.py)."""
