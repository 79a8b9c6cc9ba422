"""asv suites for pagebench: one module per subsystem, shared helpers in ``common``."""
