"""Write and read taptree trees from Python (format 2.0, see docs/FORMAT.md).

For engines written in Python: tap every op of a forward into a tree that
`taptree verify` and `taptree diff` read like one written by the Rust
`capture` crate. Equal tensors under equal keys give the same root hash,
whichever side wrote them.

    from taptree.tree import TreeWriter, open_tree

    with TreeWriter("runs/py", run={"backend": "numpy", "precision": "f32"}) as w:
        w.tap("attn_norm", 0, (0, 7), x)          # x.shape[0] == 7 positions
        w.tap("logits", None, (6, 7), logits)
    tree = open_tree("runs/py")
    for entry in tree.entries:
        print(entry["key"], tree.read(entry).shape)
    tree.verify()

Needs numpy and blake3 (`python3 -m pip install ./python` installs them).
Writes are synchronous; the manifest is written last and atomically, as in
Rust.
"""

import datetime
import json
import os
import re
import shutil
import socket
import struct
import sys

import blake3
import numpy as np
import xxhash

from .select import Selection

FORMAT_VERSION = "2.3"
FORMAT_MAJOR = 2
FORMAT_MAJOR_OLDEST = 1
UNSEALED = "0" * 64
MANIFEST = "manifest.json"
INDEX = "manifest.idx"
MARKER = ".taptree"

_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",  # ml_dtypes.bfloat16, when installed
    "float64": "F64",
    "int8": "I8",
    "int32": "I32",
}
_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "I32": "<i4"}
_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "I32": 4}
_STAGE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}$")


class TreeError(Exception):
    """A tree that cannot be written or read; the message names the file."""


def dir_of(layer):
    return "global" if layer is None else "L%03d" % layer


def path_of(stage, layer, start, end, slot):
    name = "%s.p%d-%d" % (stage, start, end)
    if slot is not None:
        name += ".s%d" % slot
    return "%s/%s.safetensors" % (dir_of(layer), name)


def key_text(key):
    """`L3/ffn_down@0..7` or `final_norm@5 slot 2`, as Rust prints a Key."""
    out = "" if key["layer"] is None else "L%d/" % key["layer"]
    start, end = key["pos"]["start"], key["pos"]["end"]
    out += "%s@%s" % (key["stage"], start if end == start + 1 else "%d..%d" % (start, end))
    if key.get("slot") is not None:
        out += " slot %d" % key["slot"]
    if key.get("rank") is not None:
        out += " rank %d" % key["rank"]
    return out


def shard_text(shard):
    """`1:0-320/576`: a tensor-parallel shard's axis, range and full extent."""
    return "%d:%d-%d/%d" % (shard["axis"], shard["start"], shard["end"], shard["full"])


def _hash_line(e):
    k = e["key"]
    opt = lambda v: "-" if v is None else str(v)  # noqa: E731
    line = "\t".join(
        [
            k["stage"],
            opt(k["layer"]),
            str(k["pos"]["start"]),
            str(k["pos"]["end"]),
            opt(k.get("slot")),
            e["dtype"],
            ",".join(str(d) for d in e["shape"]),
            e["blake3"],
        ]
    )
    # Format 2.2: a ranked tap's line carries its rank and shard.
    if k.get("rank") is not None:
        line += "\trank %d" % k["rank"]
    if k.get("shard") is not None:
        line += "\tshard " + shard_text(k["shard"])
    return line + "\n"


def _text(s):
    """A string in the root text: `{byte length}:{text}`."""
    return "%d:%s" % (len(s.encode()), s)


def tree_hashes(entries, manifest=None):
    """(per-directory hashes, root hash) of manifest entries (any order) and of
    what else in `manifest` steers a verdict: selection, run precision, prompt
    tokens and switches, stages. Format 1 manifests hash as format 1 did."""
    manifest = manifest or {}
    if str(manifest.get("format_version", FORMAT_VERSION)).split(".")[0] == "1":
        return _tree_hashes_v1(entries)
    lines = {}
    for e in entries:
        lines.setdefault(dir_of(e["key"]["layer"]), []).append(_hash_line(e).encode())
    dirs = {d: blake3.blake3(b"taptree dir v2\n" + b"".join(sorted(t))).hexdigest() for d, t in sorted(lines.items())}
    run = manifest.get("run") or {}
    root = "taptree root v2\n" + "".join("%s\t%s\n" % (d, h) for d, h in sorted(dirs.items()))
    root += "selection\t%s\n" % _text(manifest.get("selection", "all"))
    root += "precision\t%s\n" % _text(run.get("precision", ""))
    root += "tokens\t%s\n" % ",".join(str(t) for t in run.get("prompt_tokens", []))
    switches = run.get("switches") or {}
    for name in sorted(switches, key=lambda n: n.encode()):
        root += "switch\t%s\t%s\n" % (_text(name), _text(switches[name]))
    for st in manifest.get("stages") or []:
        root += "stage\t%s\t%s\t%s\t%s\n" % (
            _text(st["name"]),
            st["scope"],
            ",".join(_text(i) for i in st.get("inputs", [])),
            ",".join(_text(i) for i in st.get("first_layer_inputs", [])),
        )
    return dirs, blake3.blake3(root.encode()).hexdigest()


def _tree_hashes_v1(entries):
    lines = {}
    for e in entries:
        lines.setdefault(dir_of(e["key"]["layer"]), ["taptree dir v1\n"]).append(_hash_line(e))
    dirs = {d: blake3.blake3("".join(t).encode()).hexdigest() for d, t in sorted(lines.items())}
    root_text = "taptree root v1\n" + "".join("%s\t%s\n" % (d, h) for d, h in sorted(dirs.items()))
    return dirs, blake3.blake3(root_text.encode()).hexdigest()


def _seal_digits(raw):
    """Where the 64 hex digits of the first `manifest_blake3` value lie in raw bytes."""
    m = re.search(rb'"manifest_blake3"\s*:\s*"', raw)
    if m is None or raw[m.end() + 64 : m.end() + 65] != b'"':
        return None
    return m.end(), m.end() + 64


def manifest_seal(raw):
    """blake3 of a manifest's bytes with its manifest_blake3 digits read as zeros."""
    at = _seal_digits(raw)
    if at is None:
        return None
    return blake3.blake3(raw[: at[0]] + UNSEALED.encode() + raw[at[1] :]).hexdigest()


def sealed(raw):
    """The manifest's bytes with its manifest_blake3 filled in."""
    at = _seal_digits(raw)
    return raw[: at[0]] + manifest_seal(raw).encode() + raw[at[1] :]


_DTYPE_CODE = {"F32": 0, "F16": 1, "BF16": 2, "F64": 3, "I8": 4, "I32": 5}
_NONE = 0xFFFFFFFF


CHUNK = 1 << 20


def _checksum(major, minor, b):
    """The index's checksum of `b` (docs/FORMAT.md, "The index"): from
    format 2.3, XXH3-128 of the concatenated XXH3-128 digests of its 1 MiB
    chunks; in 2.1, XXH3-128 of its bytes."""
    if (major, minor) < (2, 3):
        return xxhash.xxh3_128_digest(b)
    return xxhash.xxh3_128_digest(
        b"".join(xxhash.xxh3_128_digest(b[i : i + CHUNK]) for i in range(0, len(b), CHUNK))
    )


def build_index(raw, manifest):
    """The bytes of `manifest.idx` for a sealed manifest's exact bytes `raw`
    and the manifest they hold (docs/FORMAT.md, "The index"): a 288-byte
    sealed head, then one 104-byte record per entry, the shapes' dimensions,
    and the strings (stage names, and paths not spelt as path_of spells them)."""
    at = raw.rfind(b'"entries":[')
    if at < 0:
        raise TreeError("manifest has no entries array to index")
    entries_at = at + len(b'"entries":[') - 1
    # Where the array ends: raw_decode over latin-1 text counts bytes.
    entries_end = json.JSONDecoder().raw_decode(raw.decode("latin-1"), entries_at)[1]
    seal = _seal_digits(raw)
    strings, ids = [], {}

    def intern(s):
        if s not in ids:
            ids[s] = len(strings)
            strings.append(s)
        return ids[s]

    records, dims = [], []
    for e in manifest["entries"]:
        k = e["key"]
        layer, slot = k.get("layer"), k.get("slot")
        path = e["path"]
        standard = path_of(k["stage"], layer, k["pos"]["start"], k["pos"]["end"], slot)
        header = e.get("header_blake3")
        records.append(
            struct.pack(
                "<5IBBHII Q32s32s",
                intern(k["stage"]),
                0 if layer is None else layer,
                k["pos"]["start"],
                k["pos"]["end"],
                0 if slot is None else slot,
                _DTYPE_CODE[e["dtype"]],
                len(e["shape"]),
                (header is not None) | (layer is not None) << 1 | (slot is not None) << 2,
                len(dims),
                _NONE if path == standard else intern(path),
                e["bytes"],
                bytes.fromhex(e["blake3"]),
                bytes.fromhex(header) if header is not None else bytes(32),
            )
        )
        dims.extend(e["shape"])
    body = b"".join(records) + struct.pack("<%dQ" % len(dims), *dims)
    for s in strings:
        b = s.encode()
        body += struct.pack("<I", len(b)) + b
    major, minor = (int(x) for x in str(manifest["format_version"]).split("."))
    head = b"taptree index\n\0\0" + struct.pack(
        "<II7Q32s32s32s32sQ",
        major,
        minor,
        len(manifest["entries"]),
        sum(e["bytes"] for e in manifest["entries"]),
        len(raw),
        entries_at,
        len(body),
        len(dims),
        len(strings),
        bytes.fromhex(manifest["root"]),
        bytes.fromhex(raw[seal[0] : seal[1]].decode()),
        blake3.blake3(raw[:entries_at] + raw[entries_end:]).digest(),
        blake3.blake3(body).digest(),
        entries_end,
    )
    head += _checksum(major, minor, raw) + _checksum(major, minor, body)
    head += bytes(256 - len(head))  # reserved
    return head + blake3.blake3(head).digest() + body


def header_hash(prefix):
    """blake3 of a tap file's bytes before its tensor data."""
    return blake3.blake3(prefix).hexdigest()


def _is_tree(path):
    return os.path.isfile(os.path.join(path, MARKER)) or os.path.isfile(os.path.join(path, MANIFEST))


def _sibling(out, what):
    parent, name = os.path.split(os.path.normpath(out))
    return os.path.join(parent, ".%s.taptree-%s-%d" % (name, what, os.getpid()))


def _span(pos):
    if isinstance(pos, int):
        return pos, pos + 1
    if isinstance(pos, range):
        return pos.start, pos.stop
    start, end = pos
    return int(start), int(end)


class TreeWriter:
    """Writes one tree. Use as a context manager, or call finish()."""

    def __init__(self, out, stages=None, run=None, force=False, select=None):
        self.out = str(out)
        self.stages = list(stages or [])
        self.selection = select if isinstance(select, Selection) else Selection.parse(select or "")
        self.run = {
            "model": "",
            "model_blake3": None,
            "backend": "",
            "precision": "",
            "switches": {},
            "prompt_tokens": [],
            "git_rev": None,
            "host": socket.gethostname(),
            "argv": list(sys.argv),
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "extra": {},
        }
        self.run.update(run or {})
        self.entries = []
        self._keys = set()
        self._staging = None
        if not os.path.lexists(self.out):
            os.makedirs(self.out)
        elif not os.path.isdir(self.out) or os.path.islink(self.out):
            raise TreeError("%s: not empty and not a taptree tree; refusing to capture into it" % self.out)
        elif os.listdir(self.out):
            if not _is_tree(self.out):
                raise TreeError(
                    "%s: not empty and not a taptree tree; refusing to capture into it (nothing was changed)"
                    % self.out
                )
            if not force:
                raise TreeError("%s: already holds a tree; pass force=True to replace it" % self.out)
            self._staging = _sibling(self.out, "new")
            shutil.rmtree(self._staging, ignore_errors=True)
            os.makedirs(self._staging)
        self.dir = self._staging or self.out
        with open(os.path.join(self.dir, MARKER), "w") as f:
            f.write("taptree tree, format %s; complete once %s exists\n" % (FORMAT_VERSION, MANIFEST))

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.finish()
        elif self._staging:
            shutil.rmtree(self._staging, ignore_errors=True)
        return False

    def wants(self, stage, layer, pos, slot=None):
        """Whether the selection keeps any row of this tap (skip the work if not)."""
        start, end = _span(pos)
        return self.selection.wants(stage, layer, start, end, slot)

    def tap(self, stage, layer, pos, array, slot=None, dtype=None):
        """Records `array` (axis 0 = positions pos[0]..pos[1]) under its key.

        numpy has no bfloat16: pass its bit patterns as uint16 with
        `dtype="BF16"`. Unselected taps are dropped; a multi-row tap is sliced
        into one tap per run of selected positions, as the Rust writer does.
        """
        start, end = _span(pos)
        if not self.selection.matches_identity(stage, layer, slot):
            return
        if self.selection.is_all():
            return self._write(stage, layer, start, end, array, slot, dtype)
        arr = np.asarray(array)
        for a, b in self.selection.selected_runs(start, end):
            rows = arr[a - start : b - start] if arr.ndim and arr.shape[0] == end - start else arr
            self._write(stage, layer, a, b, rows, slot, dtype)

    def _write(self, stage, layer, start, end, array, slot, as_dtype=None):
        key = {"stage": stage, "layer": layer, "pos": {"start": start, "end": end}, "slot": slot}
        if not _STAGE.match(stage):
            raise TreeError("bad tap %s: stage names are [A-Za-z0-9_.-], not starting with '.'" % key_text(key))
        arr = np.ascontiguousarray(array)
        dtype = _DTYPES.get(arr.dtype.name)
        if as_dtype == "BF16" and arr.dtype.name in ("uint16", "int16"):
            dtype = "BF16"
        elif as_dtype is not None and as_dtype != dtype:
            raise TreeError("bad tap %s: dtype=%s does not fit an array of %s" % (key_text(key), as_dtype, arr.dtype))
        if dtype is None:
            raise TreeError("bad tap %s: unsupported dtype %s" % (key_text(key), arr.dtype))
        if end <= start or arr.ndim == 0 or arr.shape[0] != end - start:
            raise TreeError(
                "bad tap %s: shape %s: axis 0 must be the %d positions" % (key_text(key), list(arr.shape), end - start)
            )
        ident = (stage, layer, start, end, slot)
        if ident in self._keys:
            raise TreeError("bad tap %s: tapped twice in one capture" % key_text(key))
        self._keys.add(ident)
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        meta = {"taptree.format": FORMAT_VERSION, "taptree.key": key_text(key), "stage": stage}
        if layer is not None:
            meta["layer"] = str(layer)
        meta["pos_start"], meta["pos_end"] = str(start), str(end)
        if slot is not None:
            meta["slot"] = str(slot)
        header = json.dumps(
            {"__metadata__": meta, "tap": {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [0, len(data)]}},
            separators=(",", ":"),
        ).encode()
        header += b" " * ((8 - (8 + len(header)) % 8) % 8)
        rel = path_of(stage, layer, start, end, slot)
        os.makedirs(os.path.join(self.dir, dir_of(layer)), exist_ok=True)
        prefix = struct.pack("<Q", len(header)) + header
        with open(os.path.join(self.dir, rel), "wb") as f:
            f.write(prefix)
            f.write(data)
        self.entries.append(
            {
                "key": key,
                "path": rel,
                "dtype": dtype,
                "shape": list(arr.shape),
                "blake3": blake3.blake3(data).hexdigest(),
                "bytes": len(data),
                "header_blake3": header_hash(prefix),
            }
        )

    def finish(self):
        """Writes the manifest (last, atomically); returns root, taps, bytes, path."""
        total = sum(e["bytes"] for e in self.entries)
        manifest = {
            "format": "taptree",
            "format_version": FORMAT_VERSION,
            "root": None,
            "taps": len(self.entries),
            "bytes": total,
            "manifest_blake3": UNSEALED,
            "run": self.run,
            "selection": str(self.selection),
            "stages": self.stages,
            "dirs": None,
            "entries": self.entries,
        }
        manifest["dirs"], manifest["root"] = tree_hashes(self.entries, manifest)
        root = manifest["root"]
        raw = sealed(json.dumps(manifest, separators=(",", ":")).encode() + b"\n")
        # The index first: a format 2.3 manifest is never without one.
        for name, data in ((INDEX, build_index(raw, manifest)), (MANIFEST, raw)):
            tmp = os.path.join(self.dir, name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.dir, name))
        if self._staging:
            old = _sibling(self.out, "old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(self.out, old)
            os.rename(self._staging, self.out)
            shutil.rmtree(old)
            self._staging = None
        return {"root": root, "taps": len(self.entries), "bytes": total, "path": self.out}


class Tree:
    """A complete tree: `manifest`, `entries` (forward order), `read`, `verify`."""

    def __init__(self, path):
        self.path = str(path)
        mpath = os.path.join(self.path, MANIFEST)
        if not os.path.isfile(mpath):
            raise TreeError("%s: incomplete capture: no manifest.json (the capture crashed or is still running)" % self.path)
        with open(mpath, "rb") as f:
            raw = f.read()
        try:
            self.manifest = json.loads(raw)
        except ValueError as err:
            raise TreeError("%s: bad manifest: not valid JSON: %s" % (mpath, err))
        version = str(self.manifest.get("format_version"))
        if self.manifest.get("format") != "taptree":
            raise TreeError("%s: bad manifest: not a taptree manifest" % mpath)
        major = version.split(".")[0]
        if not major.isdigit() or not FORMAT_MAJOR_OLDEST <= int(major) <= FORMAT_MAJOR:
            raise TreeError(
                "%s: unsupported tree format version %s (this reader reads %d.x to %d.x)"
                % (mpath, version, FORMAT_MAJOR_OLDEST, FORMAT_MAJOR)
            )
        if int(major) >= 2 and manifest_seal(raw) != self.manifest.get("manifest_blake3"):
            raise TreeError("%s: bad manifest: its bytes do not match its manifest_blake3 (edited or damaged)" % mpath)
        self.entries = self.manifest["entries"]
        dirs, root = tree_hashes(self.entries, self.manifest)
        if root != self.manifest["root"] or dirs != self.manifest["dirs"]:
            raise TreeError("%s: bad manifest: root does not match its entries" % mpath)
        real_root = os.path.realpath(self.path)
        for e in self.entries:
            parts = e["path"].split("/")
            if (
                os.path.isabs(e["path"])
                or len(parts) != 2
                or parts[0] != dir_of(e["key"]["layer"])
                or any(p in ("", ".", "..") for p in parts)
            ):
                raise TreeError("%s: unsafe path %r in manifest" % (self.path, e["path"]))
            full = os.path.realpath(os.path.join(self.path, e["path"]))
            if not full.startswith(real_root + os.sep):
                raise TreeError("%s: unsafe path %r in manifest: a symlink outside the tree" % (self.path, e["path"]))

    def _load(self, entry):
        path = os.path.join(self.path, entry["path"])
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 8:
            raise TreeError("%s: truncated" % path)
        (n,) = struct.unpack("<Q", raw[:8])
        if 8 + n > len(raw):
            raise TreeError("%s: truncated" % path)
        try:
            header = json.loads(raw[8 : 8 + n])
            info = header["tap"]
        except (ValueError, KeyError, TypeError) as err:
            raise TreeError("%s: not a taptree tap: %s" % (path, err))
        data = raw[8 + n :]
        if entry.get("header_blake3") not in (None, header_hash(raw[: 8 + n])):
            raise TreeError("%s: integrity failure: header blake3 differs from the manifest's" % path)
        if info["dtype"] != entry["dtype"] or info["shape"] != entry["shape"]:
            raise TreeError("%s: file and manifest disagree on dtype or shape" % path)
        if len(data) != entry["bytes"] or info["data_offsets"] != [0, entry["bytes"]]:
            raise TreeError("%s: truncated or trailing bytes: %d bytes of tensor data" % (path, len(data)))
        return path, data

    def read(self, entry):
        """The tap as a numpy array (BF16 comes back as float32)."""
        _, data = self._load(entry)
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(entry["shape"])
        return np.frombuffer(data, dtype=_NUMPY[entry["dtype"]]).reshape(entry["shape"])

    def verify(self):
        """Rehashes every tap; raises TreeError naming the first bad file."""
        for e in self.entries:
            path, data = self._load(e)
            actual = blake3.blake3(data).hexdigest()
            if actual != e["blake3"]:
                raise TreeError(
                    "%s: integrity failure: tensor blake3 is %s, manifest says %s" % (path, actual, e["blake3"])
                )
        return len(self.entries)


def open_tree(path):
    return Tree(path)
