"""The node core's running parts, below the front doors: the agent's loop (node_loop.Agent), what a door is and
reads of the node (doors), the guarantee, the MPS daemons and their limits, the cgroup limits, the audit."""
