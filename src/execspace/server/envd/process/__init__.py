"""envd's ``process.Process`` service: ``process.proto`` and the modules generated from it."""
