"""Shared training machinery: state, mesh sharding, loop, checkpoints, metrics, data, graphs, benchmarks."""
