# Slim image of the fleetprof node agent: the `agent` extra only (no FastAPI, SQLAlchemy, Dash or torch).
# NVML comes from the host driver through the NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES=utility).
#   docker build -f deploy/docker/agent.Dockerfile -t fleetprof-agent .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fleetprof ./fleetprof
COPY agent ./agent
COPY embedded ./embedded
# setuptools finds server*/dashboard* packages only if present: the agent image ships without them
RUN pip install --no-cache-dir --prefix=/install ".[agent]"

FROM python:3.11-slim
COPY --from=build /install /usr/local
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    FLEETPROF_SPOOL_DIR=/var/lib/fleetprof/spool \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
VOLUME ["/var/lib/fleetprof"]
ENTRYPOINT ["fleetprof", "agent"]
