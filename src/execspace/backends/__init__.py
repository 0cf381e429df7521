"""Backends: one package each. They never import each other or ``execspace.engine``'s callers."""
