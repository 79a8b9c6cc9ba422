"""Measuring code: what times and records the systems under test (engine, kernels, sim)."""
