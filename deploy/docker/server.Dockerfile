# fleetprof control plane: collector + REST API (`fleetprof server`), Celery workers and beat (`fleetprof worker`),
# migrations (`fleetprof db upgrade`), tokens, and the Dash dashboard (`fleetprof dashboard`). One image, two targets:
#
#   docker build -f deploy/docker/server.Dockerfile -t ghcr.io/fleetprof/server:0.1.0 .                   # full (default)
#   docker build -f deploy/docker/server.Dockerfile --target slim -t ghcr.io/fleetprof/server-slim:0.1.0 .
#
# slim  '.[server,dashboard]', no torch. Enough for the dashboard, migrations, ingest, reports and workers.
# full  slim + the `estimate` extra: torch==2.13.0 (CPU build) and transformers. Needed wherever a pre-training
#       estimate runs: server/estimate/runner.py starts `python -m server.estimate.runner` as a child of the
#       process that serves POST /api/v1/estimate (the collector) or runs the task (a Celery worker), and the
#       child traces the model with PyTorch on the meta device. No CUDA build: the estimate never uses a GPU.
#
# The source tree stays at /opt/fleetprof and is installed in editable mode: Alembic's migrations/ live beside the
# packages, not inside them (server/migrate.py finds them relative to server/), so a plain wheel would not carry
# them. Runs as an unprivileged user; state (trace blobs, beat schedule) goes to /var/lib/fleetprof, which every
# collector and worker must share (a named volume in compose, a ReadWriteMany PVC in Kubernetes).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    FLEETPROF_DATA_DIR=/var/lib/fleetprof \
    FLEETPROF_ENVIRONMENT=production
RUN python -m venv /opt/venv \
 && groupadd --system --gid 10001 fleetprof \
 && useradd --system --uid 10001 --gid fleetprof --home-dir /var/lib/fleetprof --shell /usr/sbin/nologin fleetprof \
 && install -d -o fleetprof -g fleetprof -m 0750 /var/lib/fleetprof
WORKDIR /opt/fleetprof
# Dependencies first, from pyproject.toml alone, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
x = p['optional-dependencies']; print('\n'.join(p['dependencies'] + x['server'] + x['dashboard']))" > /tmp/req.txt \
 && pip install -r /tmp/req.txt
COPY fleetprof ./fleetprof
COPY agent ./agent
COPY embedded ./embedded
COPY server ./server
COPY dashboard ./dashboard
COPY migrations ./migrations
RUN pip install --no-deps -e . && fleetprof server --help >/dev/null && fleetprof dashboard --help >/dev/null
USER fleetprof
EXPOSE 8000 8050
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
CMD ["fleetprof", "server", "--host", "0.0.0.0", "--port", "8000"]

FROM slim AS full
USER root
# The CPU wheel first: the `estimate` extra's torch==2.13.0 is then already satisfied (2.13.0+cpu matches it) and
# pip does not pull the multi-GB CUDA build from the default index.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && python -c "import tomllib; x = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']; \
print('\n'.join(x['estimate']))" > /tmp/req-estimate.txt \
 && pip install -r /tmp/req-estimate.txt \
 && python -c "import torch, transformers; print('torch', torch.__version__)"
USER fleetprof
