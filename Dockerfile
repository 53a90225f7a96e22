# syntax=docker/dockerfile:1
# The fraud-scorer image: the installed package and its console scripts (fraud-scorer,
# fraud-loadgen, fraud-dlq), nothing else from the repository. One image per variant:
#
#   docker build -t fraud-scorer:local .                                   # CPU (default)
#   docker build -t fraud-scorer:cuda --build-arg VARIANT=gpu \
#     --build-arg BASE_IMAGE=nvidia/cuda:13.1.1-cudnn-runtime-ubuntu24.04 .  # CUDA
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/fraud-scorer:TAG --push .
#
# VARIANT picks the lock the dependencies come from: requirements/cpu.txt (the CPU build of ONNX
# Runtime, about 20 MB) or requirements/gpu.txt (onnxruntime-gpu, which also carries the CPU
# provider). Both locks hold wheels for linux/amd64 and linux/arm64 with their hashes, so the
# same build gives the same packages on both (`make lock` regenerates them).
#
# BASE_IMAGE: any Debian/Ubuntu image with Python 3.11+, or without Python (then the
# distribution's is installed). For VARIANT=gpu, an nvidia/cuda "cudnn-runtime" image of the
# CUDA major that the locked onnxruntime-gpu links: 1.31 links CUDA 13 and cuDNN 9 (host driver
# >= 580); docker-compose.gpu.yml and the Helm chart's values-gpu.yaml name that image, and
# tests/deploy checks that they agree with the lock.
#
# Needs BuildKit (Docker 23+, buildx) or podman/buildah: the pip cache and the CA bundle are
# build mounts. Behind a TLS-intercepting proxy, pass its CA bundle as a build secret; it is
# used by pip during the build and never lands in a layer:
#   docker build --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt .
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
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
ARG VARIANT=cpu
RUN python3 -m venv /opt/venv
# 1. Dependencies, from the variant's lock alone: this layer is rebuilt only when the lock
#    changes, never for a source or README edit. The cache mount keeps downloaded wheels
#    across builds.
COPY requirements/${VARIANT}.txt /tmp/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && /opt/venv/bin/pip install --require-hashes --no-deps -r /tmp/requirements.txt
# 2. The project itself, without its dependencies (the lock provided them, for this variant).
#    README.md is the package's `readme` (pyproject.toml); the model package scorer/models/*/
#    ships as package-data of `scorer`. One COPY per package of [tool.setuptools] packages.
COPY pyproject.toml README.md /src/
COPY plumbing /src/plumbing
COPY contracts /src/contracts
COPY simulator /src/simulator
COPY stream /src/stream
COPY terminals /src/terminals
COPY review /src/review
COPY scorer /src/scorer
COPY deadletter /src/deadletter
COPY loadgen /src/loadgen
COPY training /src/training
COPY model_tools /src/model_tools
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation --no-cache-dir /src \
    && /opt/venv/bin/python -c 'from stream.startup.config import SHIPPED_MODEL_PATH as p; from scorer.model_package import load_model_package as load; load(p)' \
    && /opt/venv/bin/python -c 'import onnxruntime, confluent_kafka, numpy, numba, msgspec, prometheus_client, tenacity, argon2'

FROM base
COPY --from=build /opt/venv /opt/venv
# numba caches the compiled card update (scorer/card_history_update.py) here: the only path the Helm
# chart's read-only root leaves writable is /tmp. Without a cache a start compiles it (~1 s).
ENV PATH=/opt/venv/bin:$PATH \
    NUMBA_CACHE_DIR=/tmp/numba-cache
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
# /reports belongs to it: a named volume mounted there starts with this owner, so
# `fraud-loadgen --report /reports/...` can write (docker-compose.yml mounts one).
RUN groupadd --system --gid 10001 scorer \
    && useradd --system --uid 10001 --gid scorer --create-home --home-dir /home/scorer \
        --shell /usr/sbin/nologin scorer \
    && install -d -o 10001 -g 10001 /reports /var/lib/fraud-review
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
