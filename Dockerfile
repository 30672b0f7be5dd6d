# sedd: the HTTP service (`sedd serve`) and the CLIs, CUDA-capable.
#
#   docker build -t sedd .
#   docker run --gpus all -p 8000:8000 sedd                      # the service on :8000
#   docker run --gpus all -v "$PWD/out:/app/out" sedd sedd generate --num-cells 5 --out out/g.h5ad
#
# CUDA: the torch wheel brings its own CUDA runtime libraries (the nvidia-* wheels it depends on),
# so the base image needs only Python; the host's NVIDIA driver is mounted into the container by
# the NVIDIA Container Toolkit (`--gpus`). torch 2.13.0 from PyPI is its CUDA build on Linux
# x86_64. To pick another CUDA version, point TORCH_INDEX_URL at PyTorch's wheel index for it,
# e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 (CPU-only image:
# https://download.pytorch.org/whl/cpu). Without a GPU the image runs on the CPU.
FROM python:3.12.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/app/.venv/bin:$PATH

RUN useradd --create-home --uid 10001 --user-group sedd
WORKDIR /app

# The README's install (python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .),
# split in two layers so that code changes do not re-download torch.
RUN python3 -m venv /app/.venv \
    && /app/.venv/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}"
COPY --chown=sedd:sedd pyproject.toml README.md ./
# the bundled model and its data ship inside the package (sedd/bundled)
COPY --chown=sedd:sedd sedd ./sedd
COPY --chown=sedd:sedd server ./server
COPY --chown=sedd:sedd scripts ./scripts
COPY --chown=sedd:sedd slurm ./slurm
RUN /app/.venv/bin/pip install --no-cache-dir -e . \
    && mkdir -p /app/out && chown sedd:sedd /app/out

USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://localhost:8000/healthz', timeout=4); sys.exit(0 if r.status == 200 else 1)"]
CMD ["sedd", "serve", "--host", "0.0.0.0", "--port", "8000"]
