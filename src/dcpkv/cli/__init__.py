"""Command-line entry points: `dcpkv` and `humpty-dumpty`."""
