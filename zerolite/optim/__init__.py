"""Optimizers and learning-rate schedules for zerolite."""
