#!/usr/bin/env bash
# The GPU checks as one command for the `device` tool's lease (15 minutes in all, a start included):
#   run(command="bash bench/device_checks.sh", carry=[".whl"], timeout_s=540)
# The machine has no network; its python3 holds torch (CUDA), Cython, numpy, psutil and safetensors, which is all a
# headless ckptbench needs. The bench peers travel as wheels, fetched here once (x86-64, CPython 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl \
#     fastsafetensors==0.5.0 runai-model-streamer==0.17.1
# Without them the peers check runs safetensors alone. Arguments go to bench/device_checks.py (e.g. --only nccl).
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
python3 setup.py --quiet build_ext --inplace >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 3; }
peers=()
python3 -c "import fastsafetensors, runai_model_streamer" 2>/dev/null || peers=(--peers safetensors)
export PYTHONUNBUFFERED=1
exec python3 bench/device_checks.py "${peers[@]}" "$@"
