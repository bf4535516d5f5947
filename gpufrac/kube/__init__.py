"""The Kubernetes client edge both the agent and the certificate rotation use: one config loader, one error mapper."""
