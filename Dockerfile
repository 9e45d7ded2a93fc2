# syntax=docker/dockerfile:1
#
# Images of resumable-training (docs/install.md, "Build the images"):
#
#   docker build -t rtj-operator:0.1.0 .                    the operator (default target): no torch
#   docker build --target runtime -t rtj-train:0.1.0 .      a training base image: trainer_runtime,
#                                                           torch, boto3 and examples/
#
# Each image installs the locked dependencies of one half of the project (uv.lock, frozen) into
# /opt/venv in a build stage, then copies only that virtual environment into a slim final stage
# that runs as a non-root user.
#
# tests/delivery/test_dockerfile.py replays the build stages (build-base, build-operator,
# build-runtime) outside Docker: it runs their ENV, WORKDIR, COPY and RUN instructions, in order,
# into a fresh virtual environment and checks what can be imported. Keep those stages to these
# four instructions (plus COPY --from=uv, the uv binary) so the test keeps running what Docker runs.

ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm
ARG UV_VERSION=0.13.8
# The two base images. Builds without a registry override them with local images
# (hack/images/build.sh: a Debian base with Debian's python3, and an image holding /uv).
ARG PYTHON_IMAGE=python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}
ARG UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}
# 1: the image keeps no uv cache. hack/images/build.sh passes 0 and mounts the machine's uv
# cache at /root/.cache/uv for the RUN steps, so torch is not downloaded again per build.
ARG UV_NO_CACHE=1

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------------------------------------
# Build stages
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build-base
COPY --from=uv /uv /usr/local/bin/uv
ARG UV_NO_CACHE
# Frozen: install exactly uv.lock, fail if pyproject.toml disagrees with it. No download of a
# Python: the image's own interpreter is the one the final stage has too.
ENV UV_FROZEN=1 \
    UV_NO_CACHE=${UV_NO_CACHE} \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/venv
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./

FROM build-base AS build-operator
# Dependencies first (this layer survives source edits), then the project, not editable.
RUN uv sync --no-install-project --no-editable --extra operator
COPY operator/ operator/
COPY trainer_runtime/ trainer_runtime/
RUN uv sync --no-editable --extra operator

FROM build-base AS build-runtime
RUN uv sync --no-install-project --no-editable --extra runtime --extra s3
COPY operator/ operator/
COPY trainer_runtime/ trainer_runtime/
RUN uv sync --no-editable --extra runtime --extra s3

# ---------------------------------------------------------------------------------------------
# runtime: base image for training containers. Add your code on top:
#   FROM rtj-train:0.1.0
#   COPY train.py /app/
#   CMD ["python", "/app/train.py"]
# torch is the locked PyPI build (CUDA libraries included on linux/amd64).
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="rtj-train" \
      org.opencontainers.image.description="Training base image: trainer_runtime, torch, boto3" \
      org.opencontainers.image.licenses="Apache-2.0"
# A named user with a home: torch and boto3 look up the user name and write caches under ~.
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin trainer
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
COPY --from=build-runtime /opt/venv /opt/venv
COPY examples/ /app/examples/
WORKDIR /app
USER 1000:1000
CMD ["python", "/app/examples/train_deterministic.py"]

# ---------------------------------------------------------------------------------------------
# operator (default target): kopf, kubernetes, pydantic, prometheus-client; never torch.
# The Helm chart runs it with a read-only root filesystem as UID 65532.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
LABEL org.opencontainers.image.title="rtj-operator" \
      org.opencontainers.image.description="ResumableTrainingJob operator (kopf)" \
      org.opencontainers.image.licenses="Apache-2.0"
# A named user: kopf's peering identity is "<user>@<host>" from getpass.getuser(), which fails
# for a UID without a passwd entry (the operator then exits at start-up).
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin rtj-operator
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build-operator /opt/venv /opt/venv
USER 65532:65532
# 8080: kopf liveness (/healthz), 9090: Prometheus /metrics (the chart's defaults).
EXPOSE 8080 9090
ENTRYPOINT ["rtj-operator"]
CMD ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=9090"]
