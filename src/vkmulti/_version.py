"""The package version, read by the package face, the CLI and the topology cache."""
__version__ = "0.1.0"
