"""The DRA door's decisions: claims read, prepared, recorded and reconciled, the slices published, who holds a
time-slicing claim, the tenants claims are to the node core. Pure."""
