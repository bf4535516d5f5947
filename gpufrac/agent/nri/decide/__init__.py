"""The NRI door's decisions: what a container gets at its creation, the sweep of those created without the plugin,
the sm-sharing limits told to the daemon. Pure."""
