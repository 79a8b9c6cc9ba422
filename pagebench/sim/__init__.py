"""Workloads and memory simulators: static fragmentation, time-stepped simulation, capacity."""
