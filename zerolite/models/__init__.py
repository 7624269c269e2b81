"""Small models used by the demo, the tests and the benchmarks."""
from zerolite.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
