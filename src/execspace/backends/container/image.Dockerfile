# The container backend's image, as `execspace image build --via dockerfile` builds it: Debian with Python and its
# whole standard library (python3, not python3-minimal: environments' packages import asyncio, contextvars...), a
# /tmp the daemon can copy onto the container's tmpfs, and the label naming the runtimes code blocks may use.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN python3 -c "import asyncio, contextvars, json, sqlite3, ssl" 2>/dev/null \
    || { apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*; }
RUN chmod 1777 /tmp
ENV PATH=/usr/local/bin:/usr/bin:/bin
LABEL execspace.languages=python,bash
