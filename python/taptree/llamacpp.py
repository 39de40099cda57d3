"""taptree's llama.cpp adapter: every op of llama.cpp's CPU forward, per stage.

llama.cpp runs through llama-cpp-python with its evaluation callback
(`cb_eval` in the context parameters): the scheduler asks the callback about
every node of the graph, and for each node it answers yes to, hands it the
computed tensor in host memory. The adapter maps nodes to taptree's stages
by op, weight operand and name (a node's name alone is ambiguous: `Qcur-3`
names the matmul, its reshape and its RoPE), converts F16 tensors to f32,
and writes a taptree tree.

    python3 -m taptree capture --engine llama.cpp --model-file M.gguf \\
        --tokens 1,2,3 --out runs/llamacpp

The mapping, for the llama architecture (SmolLM2):

| stage              | llama.cpp node                                            |
|--------------------|-----------------------------------------------------------|
| embedding          | GET_ROWS of `token_embd.weight` (`inp_embd`)              |
| attn_norm          | MUL by `blk.N.attn_norm.weight` (`attn_norm-N`)           |
| q_proj/k_proj/v_proj | MUL_MAT by `blk.N.attn_{q,k,v}.weight` (`Qcur-N`...)    |
| q_rope, k_rope     | ROPE whose input reshapes the q_proj/k_proj matmul        |
| attn               | `kqv_out-N`: the MUL_MAT input of `blk.N.attn_output`     |
| o_proj             | MUL_MAT by `blk.N.attn_output.weight`                     |
| post_attn_residual | ADD of the o_proj output (`ffn_inp-N`)                    |
| ffn_norm           | MUL by `blk.N.ffn_norm.weight`                            |
| ffn_gate, ffn_up   | MUL_MAT by `blk.N.ffn_{gate,up}.weight`                   |
| ffn_swiglu         | GLU (SWIGLU) of the gate and up matmuls                   |
| ffn_down           | MUL_MAT by `blk.N.ffn_down.weight`                        |
| post_ffn_residual  | ADD of the ffn_down output (`l_out-N`)                    |
| final_norm         | MUL by `output_norm.weight` (`result_norm`)               |
| logits             | MUL_MAT by `output.weight`, or `token_embd.weight` when tied |

For Gemma 3 (`general.architecture` gemma3) the vocabulary is
`stages.gemma3()`, and the mapping adds:

| stage              | llama.cpp node                                            |
|--------------------|-----------------------------------------------------------|
| embedding          | SCALE of the GET_ROWS of `token_embd.weight` (`inp_scaled`) |
| q_norm, k_norm     | MUL by `blk.N.attn_q_norm.weight` / `attn_k_norm.weight`  |
| q_rope, k_rope     | ROPE of the q_norm / k_norm node                          |
| post_attn_norm     | MUL by `blk.N.post_attention_norm.weight`                 |
| post_attn_residual | ADD of the post_attn_norm output (`sa_out-N`)             |
| ffn_geglu          | GLU (GEGLU) of the gate and up matmuls                    |
| post_ffn_norm      | MUL by `blk.N.post_ffw_norm.weight`                       |
| post_ffn_residual  | ADD of the post_ffn_norm output (`l_out-N`)               |

Gemma's graph scales the roped queries by `1/sqrt(head_dim)` (a SCALE node
that is no stage) before attention; q_rope holds them before that scale, as
taptree's forward taps them.

Layouts, as taptree's own forward has them, so no reconciliation is needed
against taptree trees: a ggml tensor `ne = [ne0, ne1, ne2]` is row-major
`[ne2, ne1, ne0]`, so Q/K after RoPE (`[head_dim, n_head, n_tokens]`) are
head-major rows `[n_tokens, n_head * head_dim]`; q/k are in GGUF's order,
whose converter permuted each head's rows for interleaved-pair RoPE
(`LLAMA_ROPE_TYPE_NORM`), exactly the order taptree's forward computes in
from the same GGUF (a Hugging Face tree has the rotate-half order instead).
Attention reads the K/V cache padded to a multiple of 256 cells, the unused
cells masked to -inf (zero weight): only the real positions matter, and the
k_rope/v_proj taps hold exactly those.

Stages llama.cpp fuses: with flash attention on, scores and softmax live
inside one FLASH_ATTN_EXT node whose output is `attn`, so nothing is lost
at this stage granularity; every stage of the llama vocabulary is a node.
A stage that no node maps to in a run is reported and left out of the
vocabulary, never filled in.
"""

import ctypes
import os
import sys

import numpy as np

from . import stages as st
from .tree import TreeWriter

ENGINE = "llama.cpp"

# The weight of a MUL_MAT (its src0) names its stage.
MATMUL_WEIGHTS = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "ffn_gate",
    "ffn_up": "ffn_up",
    "ffn_down": "ffn_down",
}
NORM_WEIGHTS = {
    "attn_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    # Gemma 3's
    "attn_q_norm": "q_norm",
    "attn_k_norm": "k_norm",
    "post_attention_norm": "post_attn_norm",
    "post_ffw_norm": "post_ffn_norm",
}
# The norm whose output each residual ADD adds, per family: llama adds the
# projections themselves, Gemma 3 their post-norms.
RESIDUAL_OF = {
    "o_proj": "post_attn_residual",
    "ffn_down": "post_ffn_residual",
    "post_attn_norm": "post_attn_residual",
    "post_ffn_norm": "post_ffn_residual",
}
# Architectures whose graph scales the embedding rows (`inp_scaled`, a SCALE
# of the GET_ROWS): the stage is the scaled rows.
SCALED_EMBEDDING = ("gemma3",)


def vocabulary_of(arch):
    """The stage vocabulary of a model architecture (`general.architecture`)."""
    return st.gemma3() if arch == "gemma3" else st.llama()
VIEW_OPS = {"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "CONT", "CPY"}
PER_HEAD = ("q_norm", "k_norm", "q_rope", "k_rope")

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml.h (the vendored llama.cpp's layout)."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * 16),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(GgmlTensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * 64),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]


def _log_errors_only(level, text, _user):
    # ggml_log_level: 4 is ERROR (5, CONT, continues the previous line).
    if level == 4 and text:
        sys.stderr.write("llama.cpp: " + text.decode(errors="replace"))


_QUIET_LOG = None  # the ctypes callback, built on first use and kept alive


def _quiet(llama_cpp):
    global _QUIET_LOG
    if _QUIET_LOG is None:
        _QUIET_LOG = llama_cpp.llama_log_callback(_log_errors_only)
    return _QUIET_LOG


class EngineError(Exception):
    """The run cannot be captured (bad input, or a graph the mapping does not
    know); the message says why (exit 2)."""


def _ggml_base(llama_cpp):
    """libggml-base from llama-cpp-python's lib directory (for op names, version)."""
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = os.path.join(libdir, name)
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            lib.ggml_op_desc.restype = ctypes.c_char_p
            lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
            lib.ggml_version.restype = ctypes.c_char_p
            lib.ggml_commit.restype = ctypes.c_char_p
            return lib
    raise EngineError("%s: no libggml-base in llama-cpp-python's lib directory" % libdir)


def _weight_stage(name):
    """(stage, layer) of a MUL_MAT weight name, e.g. `blk.3.attn_q.weight`."""
    if name in ("output.weight", "token_embd.weight"):
        return "logits", None
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in MATMUL_WEIGHTS:
        return MATMUL_WEIGHTS[parts[2]], int(parts[1])
    return None, None


def _norm_stage(name):
    if name == "output_norm.weight":
        return "final_norm", None
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in NORM_WEIGHTS:
        return NORM_WEIGHTS[parts[2]], int(parts[1])
    return None, None


def read_tensor(t):
    """The tensor's values as a row-major f32 array of shape ne reversed."""
    ndim = GGML_MAX_DIMS
    shape = tuple(int(t.ne[i]) for i in reversed(range(ndim)))
    strides = tuple(int(t.nb[i]) for i in reversed(range(ndim)))
    if t.type == GGML_TYPE_F32:
        dtype = np.float32
    elif t.type == GGML_TYPE_F16:
        dtype = np.float16
    else:
        raise EngineError("node %s: type %d is not F32 or F16" % (t.name.decode(), t.type))
    itemsize = np.dtype(dtype).itemsize
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + itemsize
    raw = (ctypes.c_char * span).from_address(t.data)
    base = np.frombuffer(raw, dtype=np.uint8)
    view = np.lib.stride_tricks.as_strided(base.view(dtype)[:1], shape=shape, strides=strides)
    return np.ascontiguousarray(view).astype(np.float32)


class Mapper:
    """Names each graph node's stage (or None), by op, weight operand and name."""

    def __init__(self, ggml, n_layer, arch="llama"):
        self.ggml = ggml
        self.n_layer = n_layer
        self.scaled_embedding = arch in SCALED_EMBEDDING
        self.embd_rows = None  # this graph's GET_ROWS of the embedding
        self.stage_of = {}  # node address -> (stage, layer), for this graph

    def op(self, t_ptr):
        return self.ggml.ggml_op_desc(t_ptr).decode()

    def _through_views(self, t, also=()):
        """The first node at or below `t` that is mapped to a stage or is not a
        view/reshape/copy (nor one of the ops in `also`)."""
        seen = 0
        while t and seen < 16:
            addr = ctypes.addressof(t.contents)
            op = self.op(addr)
            if addr in self.stage_of or (op not in VIEW_OPS and op not in also) or not t.contents.src[0]:
                return addr
            t = t.contents.src[0]
            seen += 1
        return None

    def classify(self, t_ptr):
        t = GgmlTensor.from_address(t_ptr)
        op = self.op(t_ptr)
        name = t.name.decode(errors="replace")
        srcs = [t.src[i] for i in range(GGML_MAX_SRC)]
        src_name = lambda i: srcs[i].contents.name.decode(errors="replace") if srcs[i] else ""  # noqa: E731
        src_addr = lambda i: ctypes.addressof(srcs[i].contents) if srcs[i] else None  # noqa: E731
        found = (None, None)
        if op == "GET_ROWS" and src_name(0) == "token_embd.weight":
            self.stage_of.clear()  # a new graph starts
            self.embd_rows = t_ptr
            if not self.scaled_embedding:
                found = ("embedding", None)
        elif op == "SCALE" and self.scaled_embedding and src_addr(0) == self.embd_rows:
            found = ("embedding", None)
        elif op == "MUL_MAT":
            found = _weight_stage(src_name(0))
            if found[0] == "o_proj":
                # attn is o_proj's input: check that it was the node named for it.
                inp = self.stage_of.get(self._through_views(srcs[1]))
                if inp != ("attn", found[1]):
                    raise EngineError(
                        "node %s: o_proj's input is %s, not layer %d's attn (kqv_out)" % (name, inp, found[1])
                    )
        elif op == "MUL":
            found = _norm_stage(src_name(1))
        elif op == "ROPE":
            below = self.stage_of.get(self._through_views(srcs[0]))
            if below and below[0] in ("q_proj", "k_proj", "q_norm", "k_norm"):
                found = (below[0][0] + "_rope", below[1])
        elif op in ("CONT", "CPY", "RESHAPE") and name.startswith("kqv_out-"):
            # CONT of the permuted KQV product; with flash attention, the
            # RESHAPE of FLASH_ATTN_EXT's output.
            found = ("attn", int(name.rsplit("-", 1)[1]))
        elif op == "ADD":
            if src_name(0).endswith(".bias") or src_name(1).endswith(".bias"):
                # taptree's projections include their bias; llama.cpp adds it
                # as a node of its own, which this mapping does not follow.
                raise EngineError("node %s: a bias add (%s): models with biases are not mapped yet" % (
                    name, src_name(1) if src_name(1).endswith(".bias") else src_name(0)))
            for i in (0, 1):
                # The last layer picks its output rows (GET_ROWS by
                # inp_out_ids) before the residual; every row is an output
                # here, so that selection keeps all rows in order.
                below = self.stage_of.get(self._through_views(srcs[i], also=("GET_ROWS",)))
                if below and below[0] in RESIDUAL_OF:
                    found = (RESIDUAL_OF[below[0]], below[1])
        elif op in ("SWIGLU", "GEGLU"):
            a, b = self.stage_of.get(src_addr(0)), self.stage_of.get(src_addr(1))
            if a and b and (a[0], b[0]) == ("ffn_gate", "ffn_up"):
                found = ("ffn_" + op.lower(), a[1])
        if found[0] is not None:
            self.stage_of[t_ptr] = found
        return found


def _avx512_flags():
    """This CPU's AVX-512 flags (/proc/cpuinfo), sorted; None where unreadable.
    llama-cpp-python compiles llama.cpp with -march=native, and its
    system_info does not name every extension that changes ggml's
    arithmetic (AVX512-FP16 makes flash attention sum values in f16)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted({x for x in line.split(":", 1)[1].split() if x.startswith("avx512")})
    except OSError:
        pass
    return None


def _version(llama_cpp, ggml):
    out = {
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "ggml_version": ggml.ggml_version().decode(),
        "ggml_commit": ggml.ggml_commit().decode(),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }
    flags = _avx512_flags()
    if flags is not None:
        out["cpu_avx512_flags"] = flags
    return out


def default_threads():
    """llama-cpp-python's default: half the CPUs, at least one."""
    return max((os.cpu_count() or 2) // 2, 1)


def run_llamacpp(
    model_file, tokens, gen=0, stop=(), threads=None, flash_attn=False, n_batch=512, kv_type="f16", on_tap=None
):
    """Runs `tokens` (then up to `gen` greedy tokens, ending at one in
    `stop`) through llama.cpp, calling `on_tap(stage, layer, start, array)`
    for every mapped node. Returns (logits of every fed position as
    [n, vocab] f32, generated ids, the run's facts)."""
    try:
        import llama_cpp
    except ImportError as e:
        raise EngineError("llama.cpp: cannot import llama_cpp (python3 -m pip install llama-cpp-python): %s" % e)

    ggml = _ggml_base(llama_cpp)
    llama_cpp.llama_log_set(_quiet(llama_cpp), None)
    if not os.path.isfile(model_file):
        raise EngineError("%s: no such model file" % model_file)
    kv_types = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}
    if kv_type not in kv_types:
        raise EngineError("kv cache type %r: expected f16 or f32" % kv_type)
    threads = threads or default_threads()

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(model_file.encode(), mparams)
    if not model:
        raise EngineError("%s: llama.cpp cannot load this model" % model_file)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    n_layer = llama_cpp.llama_model_n_layer(model)
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        llama_cpp.llama_model_free(model)
        raise EngineError("%s: token id %d is outside the vocabulary (size %d)" % (model_file, bad[0], n_vocab))

    buf = ctypes.create_string_buffer(64)
    arch = "llama"
    if llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf)) > 0:
        arch = buf.value.decode()
    mapper = Mapper(ggml, n_layer, arch)
    state = {"next": 0, "start": 0, "error": None}

    def callback(t_ptr, ask, _user):
        try:
            if ask:
                stage, _ = mapper.classify(t_ptr)
                return stage is not None
            stage, layer = mapper.stage_of.get(t_ptr, (None, None))
            if stage is None:
                return True
            t = GgmlTensor.from_address(t_ptr)
            if stage == "embedding":
                # The first node of each graph: its rows are the ubatch's positions.
                state["start"] = state["next"]
                state["next"] += int(t.ne[1])
            arr = read_tensor(t)
            # Axis 0 is the tokens: ne[1] for 2-D nodes, ne[2] for the
            # per-head [n_tokens, n_head, head_dim] of the q/k norms and RoPE.
            rows = int(t.ne[2]) if stage in PER_HEAD else int(t.ne[1])
            if on_tap is not None:
                on_tap(stage, layer, state["start"], arr.reshape(rows, arr.size // rows))
            return True
        except Exception as e:  # an exception must not unwind through C
            state["error"] = e
            return False

    cb = llama_cpp.ggml_backend_sched_eval_callback(callback)
    cparams = llama_cpp.llama_context_default_params()
    n_ctx = len(tokens) + gen
    cparams.n_ctx = max(256, -(-n_ctx // 256) * 256)
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = 1
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.type_k = kv_types[kv_type]
    cparams.type_v = kv_types[kv_type]
    cparams.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    cparams.cb_eval = cb
    cparams.cb_eval_user_data = None
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise EngineError("%s: llama.cpp cannot create a context" % model_file)

    def decode(ids, start):
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        try:
            batch.n_tokens = len(ids)
            for i, t in enumerate(ids):
                batch.token[i] = t
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1  # every position is an output
            rc = llama_cpp.llama_decode(ctx, batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if state["error"] is not None:
            raise state["error"]
        if rc != 0:
            raise EngineError("llama.cpp: llama_decode failed (%d) at position %d" % (rc, start))
        ptr = llama_cpp.llama_get_logits(ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(ids) * n_vocab,)).reshape(len(ids), n_vocab).copy()

    try:
        all_logits = []
        generated = []
        for i in range(0, len(tokens), n_batch):
            all_logits.append(decode(tokens[i : i + n_batch], i))
        # Greedy, as the other engines: the last generated token is not fed.
        for step in range(gen):
            nxt = int(np.argmax(all_logits[-1][-1]))
            generated.append(nxt)
            if nxt in stop or step == gen - 1:
                break
            all_logits.append(decode([nxt], len(tokens) + step))
        facts = {
            "engine": ENGINE,
            "engine_versions": _version(llama_cpp, ggml),
            "threads": threads,
            "kv_cache_type": kv_type,
            "flash_attn": bool(flash_attn),
            "n_batch": n_batch,
            "n_ubatch": n_batch,
            "n_ctx": int(cparams.n_ctx),
            "all_ops_f64": False,
            "architecture": arch,
        }
        return np.concatenate(all_logits), generated, facts
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
        del cb


def capture_llamacpp(
    model_file, tokens, out, gen=0, stop=(), select=None, force=False, threads=None, flash_attn=False,
    n_batch=512, kv_type="f16", run=None,
):
    """Captures a llama.cpp run into the tree `out`. Returns the writer's
    summary (root, taps, bytes, path) with `generated` and `logits` (every
    fed position's logits as llama.cpp returned them)."""
    taps = []
    logits, generated, facts = run_llamacpp(
        model_file,
        tokens,
        gen=gen,
        stop=stop,
        threads=threads,
        flash_attn=flash_attn,
        n_batch=n_batch,
        kv_type=kv_type,
        on_tap=lambda stage, layer, start, arr: taps.append((stage, layer, start, arr)),
    )

    stages = vocabulary_of(facts["architecture"])
    stage_index = {s["name"]: i for i, s in enumerate(stages)}

    # Forward order: by position block (one graph each), then the embedding,
    # the layers in order with their stages in vocabulary order, the head.
    def order(tap):
        stage, layer, start, _ = tap
        phase = 0 if stage == "embedding" else (2 if layer is None else 1)
        return (start, phase, -1 if layer is None else layer, stage_index[stage])

    taps.sort(key=order)
    seen = {s for s, _, _, _ in taps}
    vocabulary = [s for s in stages if s["name"] in seen]
    missing = [s["name"] for s in stages if s["name"] not in seen]
    if missing:
        print("taptree: llama.cpp: no node maps to %s; left out of the tree" % ", ".join(missing), file=sys.stderr)
    record = {
        "model": os.path.abspath(model_file),
        "backend": "llama.cpp/cpu",
        "precision": "llama.cpp",
        "prompt_tokens": list(tokens),
    }
    record.update(run or {})
    extra = dict(record.get("extra") or {})
    extra.update(facts)
    extra["generated_tokens"] = [generated]
    record["extra"] = extra
    writer = TreeWriter(out, stages=vocabulary, run=record, force=force, select=select)
    try:
        for stage, layer, start, arr in taps:
            writer.tap(stage, layer, (start, start + arr.shape[0]), arr)
    except BaseException:
        writer.__exit__(RuntimeError, None, None)  # drops the staging directory
        raise
    summary = writer.finish()
    summary["generated"] = generated
    summary["logits"] = logits
    return summary


def settings(env=None):
    """The llama.cpp context settings from the environment, checked:
    `TAPTREE_LLAMACPP_FLASH_ATTN` (0 or 1, default 0),
    `TAPTREE_LLAMACPP_KV_TYPE` (f16 or f32, default f16),
    `TAPTREE_LLAMACPP_N_BATCH` (a positive integer, default 512): by default
    llama-cpp-python's own defaults. Each lands in the manifest."""
    env = os.environ if env is None else env
    fa = env.get("TAPTREE_LLAMACPP_FLASH_ATTN", "0").strip()
    if fa not in ("0", "1"):
        raise EngineError("TAPTREE_LLAMACPP_FLASH_ATTN: bad value %r: expected 0 or 1" % fa)
    kv = env.get("TAPTREE_LLAMACPP_KV_TYPE", "f16").strip()
    if kv not in ("f16", "f32"):
        raise EngineError("TAPTREE_LLAMACPP_KV_TYPE: bad value %r: expected f16 or f32" % kv)
    nb = env.get("TAPTREE_LLAMACPP_N_BATCH", "512").strip()
    if not nb.isdigit() or int(nb) < 1:
        raise EngineError("TAPTREE_LLAMACPP_N_BATCH: bad value %r: expected a positive integer" % nb)
    return {"flash_attn": fa == "1", "kv_type": kv, "n_batch": int(nb)}


def capture(args):
    """`python3 -m taptree capture --engine llama.cpp` (see taptree.__main__)."""
    knobs = settings()
    if args.precision != "f32":
        raise EngineError(
            "--precision %s: llama.cpp's CPU forward has one arithmetic (f32 activations, quantized dot "
            "products); ask for f32" % args.precision
        )
    summary = capture_llamacpp(
        args.model_file,
        args.tokens,
        args.out,
        gen=args.gen,
        stop=tuple(args.stop),
        select=args.selection,
        force=args.force,
        threads=args.threads or None,
        run=args.run,
        **knobs,
    )
    summary.pop("logits")
    return summary
