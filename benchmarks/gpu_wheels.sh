#!/usr/bin/env bash
# The wheels a GPU machine without a package index needs to run src_dask's GPU tests and
# benchmarks, downloaded here into .whl/ (git-ignored) with .whl/install.sh, which
# installs them there into /tmp/site. Run from the repository's root:
#
#   bash benchmarks/gpu_wheels.sh                # the dask stack, zarr, the dashboard
#   bash benchmarks/gpu_wheels.sh --ucx          # and UCX + RMM (RMM pools, UCX between
#                                                # GPUs); no bokeh, to carry under 64 MiB
#   bash benchmarks/gpu_wheels.sh --rmm          # and RMM alone (src_dask.cluster()'s
#                                                # allocator), ~7 MB against --ucx's ~55 MB
#   bash benchmarks/gpu_wheels.sh --quimb        # and quimb (the benchmarks' peer)
#   bash benchmarks/gpu_wheels.sh --py-spy       # and py-spy (what holds a worker's event
#                                                # loop: py-spy dump/record --gil --pid)
#   bash benchmarks/gpu_wheels.sh --src-method   # and src-method 0.5.0 (the peer project)
#   bash benchmarks/gpu_wheels.sh --kvikio       # and KvikIO 26.10 (tools/bench_reads.py's
#                                                # straight-to-device reads), ~5 MB
#
# then, on the GPU machine: bash .whl/install.sh && export PYTHONPATH=/tmp/site:$PWD/src
# The machine is expected to have CuPy (cuda13x), numba, numpy, scipy, opt-einsum,
# nvidia-ml-py, pytest and Python 3.12. The pins follow pyproject.toml's gpu extra
# (tests/test_benchmarks_quick.py checks that they agree).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
DASK=2026.7.1          # what dask-cuda 26.10 requires
DASK_CUDA=26.10.0
UCXX=0.52.0            # distributed-ucxx-cu13, for dask-cuda 26.10
RMM=26.10.0
wheels=(dask==$DASK distributed==$DASK dask-cuda==$DASK_CUDA rapids-dask-dependency==$DASK_CUDA
        zarr==3.4.2 numcodecs==0.17.1 donfig google-crc32c crc32c msgspec zict tblib locket partd
        tornado threadpoolctl dask-jobqueue==0.9.0)
dashboard=("bokeh<3.10" xyzservices narwhals)
for option in "$@"; do
  case $option in
    --ucx) dashboard=()
           wheels+=(distributed-ucxx-cu13==$UCXX ucxx-cu13==$UCXX libucxx-cu13==$UCXX
                    "libucx-cu13<1.22" rmm-cu13==$RMM librmm-cu13==$RMM rapids-logger) ;;
    --rmm) wheels+=(rmm-cu13==$RMM librmm-cu13==$RMM rapids-logger) ;;
    --py-spy) wheels+=(py-spy==0.4.1) ;;
    --kvikio) wheels+=(kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 cuda-pathfinder
                       nvidia-cufile==1.20.0.107 rapids-logger) ;;
    --quimb) wheels+=(quimb==1.16.0 cotengra autoray cytoolz) ;;
    --src-method) wheels+=(src-method==0.5.0 array-api-compat==1.16.0) ;;
    *) echo "gpu_wheels.sh: unknown option $option (--ucx, --rmm, --py-spy, --quimb, --src-method, --kvikio)" >&2
       exit 2 ;;
  esac
done
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${wheels[@]}" "${dashboard[@]}"
cat > .whl/install.sh <<'INSTALL'
#!/usr/bin/env bash
# Install the carried wheels into /tmp/site (the GPU machine has no package index).
set -e
here=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$here"/*.whl
echo "installed $(ls "$here"/*.whl | wc -l) wheels into /tmp/site; export PYTHONPATH=/tmp/site"
INSTALL
chmod +x .whl/install.sh
du -sh .whl
