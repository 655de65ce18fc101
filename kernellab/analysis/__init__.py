"""Device-free analysis: architecture tables, occupancy, shared-memory banks, roofline math (pure NumPy)."""
