"""Helpers for zerolite's own tests and benchmarks (multi-rank runner, references)."""
