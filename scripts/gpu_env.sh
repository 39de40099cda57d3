# Sourced by gpu_matrix.sh, gpu_tp.sh and gpu_gemma.sh on the GPU machine, with BUNDLE
# and WORK set: the step/run loggers, the bundled binaries on PATH, NVRTC
# found and linked, the PTX cache in $WORK.

step() { echo; echo "=== $*"; }
run() { echo "\$ $*"; "$@"; echo "[exit $?]"; }

# The binaries; kept in $WORK so a later call on the same machine has them.
if [[ -f $BUNDLE/bin.tar.gz ]]; then
    tar -C "$WORK/bin" -xzf "$BUNDLE/bin.tar.gz"
fi
export PATH=$WORK/bin:$PATH

# NVRTC: cudarc looks for libnvrtc.so by its usual names; CUDA 13 installs
# libnvrtc.so.13, so link whichever is found into a directory of our own.
mkdir -p "$WORK/lib"
nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda-*/lib64/libnvrtc.so* \
    /usr/lib/x86_64-linux-gnu/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
if [[ -z $nvrtc ]]; then
    nvrtc=$(find / -xdev -name 'libnvrtc.so*' ! -name '*builtins*' 2>/dev/null | head -1)
fi
if [[ -n $nvrtc ]]; then
    ln -sf "$nvrtc" "$WORK/lib/libnvrtc.so"
    export LD_LIBRARY_PATH=$WORK/lib:$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export TAPTREE_PTX_CACHE=$WORK/ptx

# The SmolLM2 GGUF as $MODEL: whole in the bundle, or its parts (which may
# arrive in separate calls and wait in $WORK) joined and checked against
# MODEL_SHA256; no $MODEL while parts are missing.
join_model() {
    local p
    for p in "$BUNDLE"/model.part*; do
        [[ -f $p ]] && cp "$p" "$WORK/"
    done
    MODEL=$WORK/model.gguf
    if [[ -f $BUNDLE/model.gguf ]]; then
        cp "$BUNDLE/model.gguf" "$MODEL"
    elif [[ ! -f $MODEL ]] && ls "$WORK"/model.part* >/dev/null 2>&1; then
        cat "$WORK"/model.part* > "$MODEL.tmp" && mv "$MODEL.tmp" "$MODEL"
    fi
    if [[ -f $MODEL ]] && [[ $(sha256sum "$MODEL" | cut -d' ' -f1) != "$MODEL_SHA256" ]]; then
        echo "model: sha256 mismatch (parts missing or damaged): $(ls "$WORK"/model.part* 2>/dev/null | xargs)"
        rm -f "$MODEL"
    fi
}
