"""The Hopper (sm_90a) sibling of the Thor decode kernel: same arguments, same numerics, warp-level MMA."""
