"""`pinstage fixture qwen3-decode --out FILE.safetensors` read back with PyTorch.

The `safetensors` package is not needed: the header is parsed here and every tensor is
viewed with torch.frombuffer. Values are checked against formulas computed here, and
the random tensors against an independent numpy transcription of the generator's
definition (docs/tensors.md, "Random values"), bit for bit.
"""
import json
import math
import mmap
import struct
import subprocess

import numpy as np
import pytest
import torch

# The spec's table for one layer: name -> (dtype, shape, direction, std, bias).
L = 1
SPEC = [
    ("hidden_states", "BF16", [16, 5120], "IN", 1.0, 0.0),
    ("input_rms_weight", "F32", [L, 5120], "IN", 0.1, 1.0),
    ("wq", "BF16", [L * 5120, 5120], "IN", 0.02, 0.0),
    ("wk", "BF16", [L * 5120, 1024], "IN", 0.02, 0.0),
    ("wv", "BF16", [L * 5120, 1024], "IN", 0.02, 0.0),
    ("q_norm_weight", "F32", [L, 128], "IN", 0.1, 1.0),
    ("k_norm_weight", "F32", [L, 128], "IN", 0.1, 1.0),
    ("seq_lens", "I32", [16], "IN", None, None),
    ("block_table", "I32", [16 * 43], "IN", None, None),
    ("slot_mapping", "I32", [16], "IN", None, None),
    ("rope_cos", "F32", [5500, 128], "IN", None, None),
    ("rope_sin", "F32", [5500, 128], "IN", None, None),
    ("k_cache", "BF16", [L * 704512, 128], "INOUT", 0.01, 0.0),
    ("v_cache", "BF16", [L * 704512, 128], "INOUT", 0.02, 0.3),
    ("wo", "BF16", [L * 5120, 5120], "IN", 0.0006, 0.0),
    ("w_gate", "BF16", [L * 5120, 17408], "IN", 0.02, 0.0),
    ("w_up", "BF16", [L * 5120, 17408], "IN", 0.02, 0.0),
    ("w_down", "BF16", [L * 17408, 5120], "IN", 0.0004, 0.0),
    ("post_rms_weight", "F32", [L, 5120], "IN", 0.1, 1.0),
    ("out", "BF16", [16, 5120], "OUT", None, None),
]
TORCH_DTYPE = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32}
SEED, SEQ_LEN = 4321, 2049


def run_cli(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def fixture_file(cli, tmp_path_factory):
    path = tmp_path_factory.mktemp("fixture") / "qwen3.safetensors"
    done = run_cli(cli, "fixture", "qwen3-decode", "--layers", L, "--seed", SEED,
                   "--seq-len", SEQ_LEN, "--out", path, "--json", "-")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["file_bytes"] == path.stat().st_size
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        # A private copy-on-write mapping: writable for torch.frombuffer, never copied.
        buf = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = TORCH_DTYPE[info["dtype"]]
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=8 + n + begin)
        tensors[name] = t.reshape(info["shape"])
    yield header, tensors, report
    del tensors
    buf.close()


def test_header_lists_the_twenty_arguments_in_order(fixture_file):
    header, tensors, report = fixture_file
    names = sorted((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][0])
    assert names == [row[0] for row in SPEC]
    meta = header["__metadata__"]
    for name, dtype, shape, direction, _, _ in SPEC:
        assert header[name]["dtype"] == dtype
        assert header[name]["shape"] == shape
        assert meta["pinstage.direction." + name] == direction
    inputs = sum(t.numel() * t.element_size() for k, t in tensors.items() if k != "out")
    assert inputs == report["input_bytes"] == 1_027_153_728
    assert report["summary"] == "20 tensors, 19 inputs, 1,027,153,728 bytes"


def test_paging_tables(fixture_file):
    _, t, _ = fixture_file
    assert t["seq_lens"].tolist() == [SEQ_LEN] * 16
    assert t["block_table"].tolist() == list(range(16 * 43))
    pos = SEQ_LEN - 1
    assert t["slot_mapping"].tolist() == [(b * 43 + pos // 128) * 128 + pos % 128 for b in range(16)]


def test_rope_tables(fixture_file):
    _, t, _ = fixture_file
    p = np.arange(5500, dtype=np.float32)[:, None]
    inv = (10000.0 ** (-np.arange(64) / 64.0)).astype(np.float32)[None, :]
    ang = (p * inv).astype(np.float64)  # the f32 product, evaluated in double
    for name, fn in (("rope_cos", np.cos), ("rope_sin", np.sin)):
        want = np.concatenate([fn(ang), fn(ang)], axis=1).astype(np.float32)
        got = t[name].numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7, err_msg=name)


def test_out_is_zeros(fixture_file):
    _, t, _ = fixture_file
    assert not t["out"].any()


@pytest.mark.parametrize("name,dtype,shape,direction,std,bias",
                         [row for row in SPEC if row[4] is not None])
def test_random_tensor_statistics(fixture_file, name, dtype, shape, direction, std, bias):
    _, t, _ = fixture_file
    flat = t[name].reshape(-1)
    n = flat.numel()
    total = sq = 0.0
    for chunk in torch.split(flat, 1 << 24):
        d = chunk.double() - bias
        total += d.sum().item()
        sq += (d * d).sum().item()
    mean = total / n
    sd = math.sqrt(sq / n - mean * mean)
    want_sd = std
    if dtype == "BF16" and bias != 0.0:  # bf16 spacing at the bias adds q^2 / 12
        q = 2.0 ** (math.floor(math.log2(bias)) - 7)
        want_sd = math.sqrt(std * std + q * q / 12)
    assert abs(mean) < 5 * std / math.sqrt(n), (name, mean)
    assert abs(sd / want_sd - 1) < 5 / math.sqrt(2 * n), (name, sd)


# ---- an independent transcription of the generator (docs/tensors.md) ---------------------
M64 = (1 << 64) - 1
F = np.float32


def mix64(x):
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def gf_mul(a, b):
    out = 0
    for _ in range(8):
        if b & 1:
            out ^= a
        a = ((a << 1) ^ (0x1B if a & 0x80 else 0)) & 0xFF
        b >>= 1
    return out


def aes_tables():
    """te[k][v]: input byte v in row k of a column, after SubBytes and MixColumns."""
    inv = [0] * 256
    for v in range(1, 256):
        inv[v] = next(w for w in range(1, 256) if gf_mul(v, w) == 1)
    rot = lambda v, n: ((v << n) | (v >> (8 - n))) & 0xFF
    sbox = [inv[v] ^ rot(inv[v], 1) ^ rot(inv[v], 2) ^ rot(inv[v], 3) ^ rot(inv[v], 4) ^ 0x63
            for v in range(256)]
    te = np.zeros((4, 256), dtype=np.uint32)
    for v, s1 in enumerate(sbox):
        s2 = gf_mul(s1, 2)
        s3 = s2 ^ s1
        te[0, v] = s2 | s1 << 8 | s1 << 16 | s3 << 24
        te[1, v] = s3 | s2 << 8 | s1 << 16 | s1 << 24
        te[2, v] = s1 | s3 << 8 | s2 << 16 | s1 << 24
        te[3, v] = s1 | s1 << 8 | s3 << 16 | s2 << 24
    return te


TE = aes_tables()


def round_keys(seed, stream):
    state = mix64(seed + 0x9E3779B97F4A7C15 * (stream + 1))
    words = []
    for _ in range(12):
        state = (state + 0x9E3779B97F4A7C15) & M64
        v = mix64(state)
        words += [v & 0xFFFFFFFF, v >> 32]
    return np.array(words, dtype=np.uint32).reshape(6, 4)


def block_words(seed, stream, blk):
    """E_0..E_7 of each block: AES-5 (AESENC rounds) of (blk, j); shape (8, 4, n)."""
    rk = round_keys(seed, stream)
    blk = np.asarray(blk, dtype=np.uint64)
    out = np.zeros((8, 4, blk.size), dtype=np.uint32)
    for j in range(8):
        x = [(blk & np.uint64(0xFFFFFFFF)).astype(np.uint32), (blk >> np.uint64(32)).astype(np.uint32),
             np.full(blk.size, j, dtype=np.uint32), np.zeros(blk.size, dtype=np.uint32)]
        x = [x[c] ^ rk[0, c] for c in range(4)]
        for r in range(1, 6):
            x = [TE[0][x[c] & 0xFF] ^ TE[1][(x[(c + 1) % 4] >> 8) & 0xFF]
                 ^ TE[2][(x[(c + 2) % 4] >> 16) & 0xFF] ^ TE[3][x[(c + 3) % 4] >> 24] ^ rk[r, c]
                 for c in range(4)]
        out[j] = np.stack(x)
    return out


def reference_values(seed, stream, index, std, bias):
    """f32 values of elements `index` of one stream."""
    index = np.asarray(index, dtype=np.uint64)
    words = block_words(seed, stream, index // np.uint64(32))
    lane = (index % np.uint64(16)).astype(np.int64)
    second = (index // np.uint64(16)) % np.uint64(2) == 1
    cols = np.arange(index.size)
    a = words[lane // 4, lane % 4, cols]
    b = words[4 + lane // 4, lane % 4, cols]
    f = ((a >> 8) + np.uint32(1)).astype(np.int32).astype(F)
    bits = f.view(np.int32)
    e = (bits - np.int32(0x3F3504F3)) >> 23
    m = (bits - (e << 23)).view(F)
    s = (m - F(1)) / (m + F(1))
    s2 = s * s
    q = s2 * F(-0.825954556) + F(-1.33304369)
    q = q * s2 + F(-4.00000048)
    w = (np.int32(24) - e).astype(F) * F(1.38629436111989062) + s * q
    rs = np.sqrt(w) * F(std)
    ta = b + np.uint32(1 << 29)
    tb = b + np.uint32(3 << 29)
    an = ((b << 2).view(np.int32) >> 2).astype(F) * (F(math.pi) / F(2.0 ** 31))
    a2 = an * an
    ps = a2 * F(-0.000195152839) + F(0.0083321603)
    ps = ps * a2 + F(-0.166666552)
    sn = an + an * (a2 * ps)
    pc = a2 * F(-0.0013597823) + F(0.041656293)
    pc = pc * a2 + F(-0.499998957)
    cs = pc * a2 + F(1)
    swap = (ta & np.uint32(0x40000000)) != 0
    sign = np.uint32(0x80000000)
    c = np.where(swap, sn, cs).view(np.uint32) ^ (tb & sign)
    sv = np.where(swap, cs, sn).view(np.uint32) ^ (ta & sign)
    v = rs * np.where(second, sv, c).view(F)
    if bias != 0.0:
        v = v + F(bias)
    return v


def to_bf16_bits(v):
    u = v.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


@pytest.mark.parametrize("stream", [k for k, row in enumerate(SPEC) if row[4] is not None])
def test_random_values_match_an_independent_generator(fixture_file, stream):
    name, dtype, _, _, std, bias = SPEC[stream]
    _, t, _ = fixture_file
    flat = t[name].reshape(-1)
    n = flat.numel()
    rng = np.random.default_rng(stream)
    index = np.unique(np.concatenate([np.arange(min(n, 4096)), rng.integers(0, n, 4096),
                                      [n - 1]]))
    want = reference_values(SEED, stream, index, std, bias)
    got = flat[torch.from_numpy(index.astype(np.int64))]
    if dtype == "BF16":
        got_bits = got.view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(got_bits, to_bf16_bits(want), err_msg=name)
    else:
        np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32), err_msg=name)


def test_size_only_needs_no_memory(cli):
    done = run_cli(cli, "fixture", "qwen3-decode", "--layers", 40, "--size-only", "--json", "-")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["input_bytes"] == 40_859_999_040
    assert report["total_bytes"] == 40_860_162_880


@pytest.mark.parametrize("args,word", [
    (["--seq-len", "0"], "seq_len"),
    (["--seq-len", "5501"], "seq_len"),
    (["--layers", "0"], "--layers 0 is not a size"),
    (["--repeat", "0"], "--repeat"),
    (["--size-only", "--out", "x.safetensors"], "--size-only"),
])
def test_bad_parameters_are_refused(cli, args, word):
    done = run_cli(cli, "fixture", "qwen3-decode", *args)
    assert done.returncode != 0
    assert word in done.stderr, done.stderr


@pytest.mark.parametrize("args,words", [
    (["--storage", "paged"], "unknown storage 'paged'"),
    (["--upload", "x"], "--upload: x not in {direct,staged}"),
    (["--rounds", "0"], "--rounds='0' is not valid: must be in [1, 2147483647]"),
    (["--skip-golden", "--save-golden", "g.safetensors"], "--save-golden needs the golden"),
    (["--layers", "0"], "--layers 0 is not a size"),
])
def test_scene_refuses_bad_parameters_before_generating(cli, tmp_path, args, words):
    done = subprocess.run([str(cli), "scene", "qwen3-decode", *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1
    assert words in done.stderr, done.stderr
    assert "generated" not in done.stdout and not any(tmp_path.iterdir())
