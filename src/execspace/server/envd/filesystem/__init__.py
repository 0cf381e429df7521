"""envd's ``filesystem.Filesystem`` service: ``filesystem.proto`` and the modules generated from it."""
