"""The package version, in a module of its own so that code inside zerolite can read it
without importing the package root (which imports the engine, which imports that code)."""
__version__ = "0.1.0"
