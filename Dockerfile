# A reproducible image with Horo, PyTorch (CPU build) and Open MPI.
#   docker build -t horo .
#   docker run --rm horo    # trains examples/pytorch/pytorch_digits.py on 2 ranks
FROM python:3.11-slim

# g++ builds the core; Open MPI and its headers let mpi4py build and mpirun launch Horo jobs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ openmpi-bin libopenmpi-dev \
 && rm -rf /var/lib/apt/lists/*

# The package is installed from a copy of the source that is removed afterwards; only the examples
# stay, in the working directory. A source tree there would shadow the installed package: its
# horo_core (with no built core) comes first on sys.path for `python -m` and `python -c`.
WORKDIR /opt/horo
COPY . /tmp/horo-src

# torch is pinned to the CPU build so that pip does not pull several GB of CUDA packages.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install --no-cache-dir -c /tmp/horo-src/test/constraints.txt '/tmp/horo-src[torch,mpi,examples]' \
 && cp -r /tmp/horo-src/examples /opt/horo/examples \
 && rm -rf /tmp/horo-src

# mpirun refuses to run as root unless told it is intended (containers run as root).
ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

CMD ["hororun", "-np", "2", "python", "examples/pytorch/pytorch_digits.py"]
