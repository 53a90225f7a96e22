# The fraud-scorer image: the installed package and its console scripts (fraud-scorer,
# fraud-loadgen, fraud-dlq), nothing else from the repository.
#
#   docker build -t fraud-scorer:local .                       # CPU, python:3.12-slim
#   docker build -t fraud-scorer:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:13.1.1-cudnn-runtime-ubuntu24.04 .   # GPU
#
# BASE_IMAGE selects the base. The default slim image runs the CPU execution provider (the
# onnxruntime-gpu wheel carries it). The CUDA provider needs the CUDA runtime libraries and
# cuDNN 9 of the CUDA major version that the onnxruntime-gpu wheel resolved at build time was
# built for: 1.31.1, the newest when this was written, links libcudart.so.13 and
# libcublas.so.13 (CUDA 13); earlier releases linked CUDA 12 and need a 12.x base. Use an
# nvidia/cuda "cudnn-runtime" image of that major, on a host whose driver supports it (>= 580
# for CUDA 13). Those images have no Python: the base stage installs the distribution's (3.12
# on ubuntu24.04). docker-compose.gpu.yml passes this argument.
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -c 'import sys; assert sys.version_info >= (3, 11), "need Python 3.11+, got " + sys.version'

# Build stage: install into a virtualenv; only the virtualenv goes into the final image.
FROM base AS build
RUN python3 -m venv /opt/venv
# README.md is the package's `readme` (pyproject.toml); scorer/models/*.onnx ships as
# package-data of `scorer`.
COPY pyproject.toml README.md /src/
COPY contracts /src/contracts
COPY simulator /src/simulator
COPY stream /src/stream
COPY scorer /src/scorer
COPY deadletter /src/deadletter
COPY loadgen /src/loadgen
RUN /opt/venv/bin/pip install /src \
    && /opt/venv/bin/python -c 'from stream.config import SHIPPED_MODEL_PATH as p; assert p.is_file(), p'

FROM base
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
RUN groupadd --system --gid 10001 scorer \
    && useradd --system --uid 10001 --gid scorer --create-home --home-dir /home/scorer \
        --shell /usr/sbin/nologin scorer
USER 10001:10001
WORKDIR /home/scorer

# /metrics, /healthz and /readyz (FRAUD_METRICS_PORT; ServiceConfig.metrics_port's default).
EXPOSE 9102
# Liveness only (the stream loop is beating); readiness is /readyz. urllib, not curl: the slim
# base has no curl. urlopen raises on a 503, so an unhealthy replica exits non-zero here.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('FRAUD_METRICS_PORT', '9102') + '/healthz', timeout=4)"]

ENTRYPOINT ["fraud-scorer"]
CMD ["run"]
