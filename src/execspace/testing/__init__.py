"""What execspace ships for testing backends, not for running code.

- :mod:`execspace.testing.conformance`: the conformance kit, behaviour every backend must show, as one class a
  backend's tests subclass (``EngineConformance``), given an engine or :mod:`execspace.testing.binding`'s bindings
  (both need pytest and pytest-asyncio);
- :mod:`execspace.testing.private_daemon`: a throw-away private ``dockerd``/Podman service and the offline test
  image (no pytest needed; the benchmarks use it too).

Nothing else in execspace imports this package, so pytest stays an optional dependency.
"""
