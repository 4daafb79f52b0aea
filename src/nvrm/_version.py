"""The one version number of nvrm and nvrm-client (both pyprojects read it)."""

__version__ = "0.5.0"
