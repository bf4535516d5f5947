"""The admission webhook: reads the fraction annotations, denies what cannot work, injects the limits."""
