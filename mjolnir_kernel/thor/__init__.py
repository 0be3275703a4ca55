"""Thor / tcgen05 device code (imports cutlass): the decode kernel and the split-KV reduction."""
