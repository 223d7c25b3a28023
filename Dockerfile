# syntax=docker/dockerfile:1
# dispatcher container image.
#
#   make image                      # podman/docker build -t dispatcher:0.1.0 .
#   BASE=... make image             # another Python 3.11 base (e.g. a local one)
#
# Two stages: wheels are built in the first, the second installs only those
# wheels, so no compiler, pip cache or build files reach the final image.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY dispatcher ./dispatcher
# The project and every runtime dependency as wheels, versions resolved once here.
# Behind a TLS-intercepting proxy, pass its CA bundle as a build secret
# (make image CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt): used for this
# download only, never stored in a layer.
RUN --mount=type=secret,id=ca-bundle \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python -m pip wheel --wheel-dir /wheels .

FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dispatcher" \
      org.opencontainers.image.description="Delivers RabbitMQ messages as CloudEvents over HTTP" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# No DISPATCHER_CONFIG or DISPATCHER_LISTEN here: an image-level override would
# silently beat the mounted config's http.listen, and a baked-in config would
# make Knative drop-in mode (no config file + QUEUE_NAME) impossible. Mount a
# config and point DISPATCHER_CONFIG at it, or set the Knative variables.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# --no-index: only the wheels built above, nothing fetched at this stage.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels "dispatcher==${VERSION}"
# An empty working directory: the default config path (config/dispatcher.yaml)
# is relative to it and absent unless mounted.
WORKDIR /app
# A numeric user, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
EXPOSE 9090
# Exec form: python is PID 1 and receives SIGTERM itself; the service handles
# it (readiness off, grace for in-flight work, exit 0). No HEALTHCHECK:
# Kubernetes probes /healthz and /readyz.
ENTRYPOINT ["python", "-m", "dispatcher", "run"]
