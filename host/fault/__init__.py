"""The guest kernel's anonymous page fault, timed in the guest."""
